"""Word count over a text file, used by Refract's quick start and e2e tests.

Usage:
  python wordcount.py [--input FILE] [--output PREFIX] [--top N] [BEAM OPTIONS]

Without --input it counts the bundled input.txt beside this file. Without
--output it writes to a fresh temporary directory. After the pipeline has
finished it reads the output files back and prints the N most common words
(ties broken alphabetically), then a totals line.

Any other arguments are Beam pipeline options, for example:
  --runner=PortableRunner --job_endpoint=localhost:8099 --environment_type=LOOPBACK
  --runner=PrismRunner --prism_location=/path/to/refract
"""

import argparse
import collections
import glob
import os
import re
import sys
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_INPUT = os.path.join(HERE, 'input.txt')

# A word is a run of letters, optionally joined by apostrophes ("keeper's").
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")


def split_words(line):
  """Lower-cased words of one line of text."""
  return _WORD.findall(line.lower())


def format_count(word, count):
  return '%s: %d' % (word, count)


def parse_count(line):
  word, _, count = line.rpartition(': ')
  return word, int(count)


def add_wordcount(pipeline, input_path, output_prefix):
  """Adds read -> split -> count -> format -> write to `pipeline`."""
  return (
    pipeline
    | 'Read' >> beam.io.ReadFromText(input_path)
    | 'Split' >> beam.FlatMap(split_words)
    | 'Count' >> beam.combiners.Count.PerElement()
    | 'Format' >> beam.MapTuple(format_count)
    | 'Write' >> beam.io.WriteToText(output_prefix)
  )


def read_counts(output_prefix):
  """Reads the files written by `add_wordcount` back into a dict."""
  paths = sorted(glob.glob(output_prefix + '*'))
  if not paths:
    raise FileNotFoundError('no output files match %s*' % output_prefix)
  counts = {}
  for path in paths:
    with open(path, encoding='utf-8') as f:
      for line in f:
        line = line.rstrip('\n')
        if not line:
          continue
        word, count = parse_count(line)
        if word in counts:
          raise ValueError('word %r appears twice in the output' % word)
        counts[word] = count
  return counts


def expected_counts(input_path=DEFAULT_INPUT):
  """The same counts computed in plain Python, without Beam."""
  counter = collections.Counter()
  with open(input_path, encoding='utf-8') as f:
    for line in f:
      counter.update(split_words(line))
  return dict(counter)


def top_words(counts, n):
  return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def run_wordcount(input_path, output_prefix, beam_args, runner=None):
  """Runs the pipeline to completion and returns the counts it wrote."""
  options = PipelineOptions(beam_args)
  with beam.Pipeline(runner=runner, options=options) as p:
    add_wordcount(p, input_path, output_prefix)
  return read_counts(output_prefix)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--input', default=DEFAULT_INPUT)
  parser.add_argument(
    '--output', default=None, help='output file prefix (default: a new temporary directory)'
  )
  parser.add_argument('--top', type=int, default=20)
  args, beam_args = parser.parse_known_args(argv)

  output = args.output
  if output is None:
    output = os.path.join(tempfile.mkdtemp(prefix='refract-wordcount-'), 'counts')

  counts = run_wordcount(args.input, output, beam_args)

  width = max([len(w) for w, _ in top_words(counts, args.top)] or [1])
  print('Top %d words in %s:' % (args.top, args.input))
  for word, count in top_words(counts, args.top):
    print('  %-*s %6d' % (width, word, count))
  print(
    'Total: %d words, %d distinct. Output files: %s*' % (sum(counts.values()), len(counts), output)
  )
  return 0


if __name__ == '__main__':
  sys.exit(main())
