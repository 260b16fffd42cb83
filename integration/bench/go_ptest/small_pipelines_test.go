// Package smallpipelines is a Beam Go user's test suite as Go users write
// it: small pipelines under `go test`, run by ptest on the runner its
// --runner flag names (Prism in-process by default). Each test builds its
// pipeline REFRACT_BENCH_GO_REPEAT times (default 5), one subtest each, so
// integration/bench/ptest_suite.sh can take the median of many small jobs.
package smallpipelines

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/apache/beam/sdks/v2/go/pkg/beam"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/core/graph/mtime"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/core/graph/window"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/register"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/runners/universal"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/testing/passert"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/testing/ptest"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/transforms/stats"
)

func init() {
	register.Function1x1(double)
	register.Function1x2(withOne)
	register.Function2x2(sumValues)
	register.Function2x1(formatKV)
	register.Function2x1(addSideSum)
	register.Function3x0(splitEvenOdd)
	register.Function2x0(stampSeconds)
	register.Function1x2(underOneKey)
	register.Iter1[int]()
	register.Emitter1[int]()
	register.Emitter2[beam.EventTime, int]()
}

func TestMain(m *testing.M) {
	ptest.Main(m)
}

// repeat is how many times each test builds and runs its pipeline.
func repeat() int {
	n, err := strconv.Atoi(os.Getenv("REFRACT_BENCH_GO_REPEAT"))
	if err != nil || n < 1 {
		return 5
	}
	return n
}

// each builds and runs a pipeline repeat() times, a subtest each.
func each(t *testing.T, build func(s beam.Scope)) {
	for i := 0; i < repeat(); i++ {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			p, s := beam.NewPipelineWithRoot()
			build(s)
			ptest.RunAndValidate(t, p)
		})
	}
}

func double(x int) int { return 2 * x }

func withOne(word string) (string, int) { return word, 1 }

func sumValues(key string, values func(*int) bool) (string, int) {
	sum, v := 0, 0
	for values(&v) {
		sum += v
	}
	return key, sum
}

func formatKV(key string, value int) string { return fmt.Sprintf("%s=%d", key, value) }

func addSideSum(x int, side func(*int) bool) int {
	sum, v := 0, 0
	for side(&v) {
		sum += v
	}
	return x + sum
}

func splitEvenOdd(x int, even, odd func(int)) {
	if x%2 == 0 {
		even(x)
	} else {
		odd(x)
	}
}

// stampSeconds gives x the event time of x seconds.
func stampSeconds(x int, emit func(beam.EventTime, int)) {
	emit(mtime.FromMilliseconds(int64(x)*1000), x)
}

func underOneKey(x int) (string, int) { return "k", x }

func TestMap(t *testing.T) {
	each(t, func(s beam.Scope) {
		passert.Equals(s, beam.ParDo(s, double, beam.Create(s, 1, 2, 3)), 2, 4, 6)
	})
}

func TestGroupByKey(t *testing.T) {
	each(t, func(s beam.Scope) {
		pairs := beam.ParDo(s, withOne, beam.Create(s, "a", "b", "a", "c"))
		sums := beam.ParDo(s, sumValues, beam.GroupByKey(s, pairs))
		passert.Equals(s, beam.ParDo(s, formatKV, sums), "a=2", "b=1", "c=1")
	})
}

func TestCombinePerKey(t *testing.T) {
	each(t, func(s beam.Scope) {
		pairs := beam.ParDo(s, withOne, beam.Create(s, "a", "b", "a"))
		passert.Equals(s, beam.ParDo(s, formatKV, stats.SumPerKey(s, pairs)), "a=2", "b=1")
	})
}

func TestSideInput(t *testing.T) {
	each(t, func(s beam.Scope) {
		side := beam.Create(s, 10, 20)
		out := beam.ParDo(s, addSideSum, beam.Create(s, 1, 2, 3), beam.SideInput{Input: side})
		passert.Equals(s, out, 31, 32, 33)
	})
}

func TestFlatten(t *testing.T) {
	each(t, func(s beam.Scope) {
		passert.Equals(s, beam.Flatten(s, beam.Create(s, 1, 2), beam.Create(s, 3)), 1, 2, 3)
	})
}

func TestTaggedOutputs(t *testing.T) {
	each(t, func(s beam.Scope) {
		evens, odds := beam.ParDo2(s, splitEvenOdd, beam.Create(s, 1, 2, 3, 4, 5))
		passert.Equals(s, evens, 2, 4)
		passert.Equals(s, odds, 1, 3, 5)
	})
}

func TestWindowedSums(t *testing.T) {
	each(t, func(s beam.Scope) {
		stamped := beam.ParDo(s, stampSeconds, beam.Create(s, 1, 2, 3, 12, 15))
		windowed := beam.WindowInto(s, window.NewFixedWindows(10*time.Second), stamped)
		sums := stats.SumPerKey(s, beam.ParDo(s, underOneKey, windowed))
		global := beam.WindowInto(s, window.NewGlobalWindows(), beam.ParDo(s, formatKV, sums))
		passert.Equals(s, global, "k=6", "k=27")
	})
}
