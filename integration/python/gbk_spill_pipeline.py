"""A batch GroupByKey of a given size, for the spill test and benchmark.

A splittable source (one restriction of N record indices, split only by
the runner) emits N values of VALUE_BYTES bytes under KEYS keys; a
GroupByKey groups them; each group is reduced to (1 key, its count, its
bytes) and the totals are checked in the pipeline: every value arrived,
exactly once, under its key.

    python gbk_spill_pipeline.py ENDPOINT TOTAL_MB [VALUE_KB] [KEYS]

prints the job id, waits for the job and exits 0 when it is DONE.
"""

import os
import sys

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.io.restriction_trackers import OffsetRestrictionTracker
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to

# Random bytes, sliced at different offsets: values that do not compress.
BLOCK = os.urandom(1 << 20)


class Indices(beam.RestrictionProvider):
  def initial_restriction(self, n):
    return OffsetRange(0, n)

  def create_tracker(self, restriction):
    return OffsetRestrictionTracker(restriction)

  def restriction_size(self, _, restriction):
    return restriction.size()

  def split(self, _, restriction):
    # One restriction: only the runner's dynamic splits divide the work.
    yield restriction


class Generate(beam.DoFn):
  def __init__(self, value_bytes, keys):
    self._value_bytes = value_bytes
    self._keys = keys

  def process(self, n, tracker=beam.DoFn.RestrictionParam(Indices())):
    i = tracker.current_restriction().start
    while tracker.try_claim(i):
      at = (i * 7919) % (len(BLOCK) - self._value_bytes)
      yield b'key-%08d' % (i % self._keys), BLOCK[at:at + self._value_bytes]
      i += 1


def summarize(kv):
  _, values = kv
  count = 0
  size = 0
  for v in values:
    count += 1
    size += len(v)
  return (1, count, count, count, size)


def add(rows):
  keys, low, high, count, size = 0, None, None, 0, 0
  for k, lo, hi, c, s in rows:
    keys += k
    low = lo if low is None else min(low, lo)
    high = hi if high is None else max(high, hi)
    count += c
    size += s
  return (keys, low, high, count, size)


def build(p, records, value_bytes, keys):
  per_key = records // keys
  totals = (
      p
      | beam.Create([records])
      | beam.ParDo(Generate(value_bytes, keys))
      | beam.GroupByKey()
      | beam.Map(summarize)
      | beam.CombineGlobally(add))
  # keys, fewest and most values under one key, values, bytes.
  want = (keys, per_key, per_key + (1 if records % keys else 0), records,
          records * value_bytes)
  assert_that(totals, equal_to([want]))


def main(argv):
  endpoint, total_mb = argv[1], int(argv[2])
  value_kb = int(argv[3]) if len(argv) > 3 else 100
  keys = int(argv[4]) if len(argv) > 4 else 5000
  value_bytes = value_kb * 1024
  records = total_mb * (1 << 20) // value_bytes
  keys = min(keys, records)
  options = PipelineOptions([
      '--runner=PortableRunner', '--job_endpoint=' + endpoint,
      '--environment_type=LOOPBACK'
  ])
  p = beam.Pipeline(options=options)
  build(p, records, value_bytes, keys)
  result = p.run()
  print(result._job_id, flush=True)  # pylint: disable=protected-access
  state = result.wait_until_finish()
  print(state, flush=True)
  return 0 if state == 'DONE' else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv))
