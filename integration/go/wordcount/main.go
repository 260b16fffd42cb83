// Command wordcount is a Go Beam pipeline Refract's tests run end to end:
// it counts the words of a text file and writes one "word: count" line per
// word. Given -fail_on WORD, the DoFn fails when it meets WORD, so a test
// can check that the SDK's error text reaches the user.
//
// Run it against Refract with, for example:
//
//	wordcount --input in.txt --output out.txt \
//	  --runner=universal --endpoint=localhost:8099 --environment_type=LOOPBACK
package main

import (
	"context"
	"flag"
	"fmt"
	"regexp"
	"strings"

	"github.com/apache/beam/sdks/v2/go/pkg/beam"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/io/textio"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/log"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/register"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/transforms/stats"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/x/beamx"
)

var (
	input  = flag.String("input", "", "Text file whose words are counted (required).")
	output = flag.String("output", "", "File the 'word: count' lines are written to (required).")
	failOn = flag.String("fail_on", "", "A word whose arrival fails the pipeline.")
)

// word matches the words Refract's Python word count counts: lower-case
// letters, with inner apostrophes.
var word = regexp.MustCompile(`[a-z]+(?:'[a-z]+)*`)

// splitFn emits the words of a line, failing on FailOn when it is set.
type splitFn struct {
	FailOn string
}

func (f *splitFn) ProcessElement(line string, emit func(string)) error {
	for _, w := range word.FindAllString(strings.ToLower(line), -1) {
		if f.FailOn != "" && w == f.FailOn {
			return fmt.Errorf("wordcount: met the word %q, as -fail_on asked", w)
		}
		emit(w)
	}
	return nil
}

func format(w string, n int) string {
	return fmt.Sprintf("%s: %d", w, n)
}

func init() {
	register.DoFn2x1[string, func(string), error](&splitFn{})
	register.Emitter1[string]()
	register.Function2x1(format)
}

func main() {
	flag.Parse()
	beam.Init()
	ctx := context.Background()
	if *input == "" || *output == "" {
		log.Exit(ctx, "wordcount: --input and --output are required")
	}
	p, s := beam.NewPipelineWithRoot()
	lines := textio.Read(s, *input)
	words := beam.ParDo(s, &splitFn{FailOn: *failOn}, lines)
	counts := stats.Count(s, words)
	textio.Write(s, *output, beam.ParDo(s, format, counts))
	if err := beamx.Run(ctx, p); err != nil {
		log.Exitf(ctx, "wordcount: %v", err)
	}
}
