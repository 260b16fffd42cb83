"""A batch GroupByKey of a given size, for the spill test and benchmark.

A splittable source (one restriction of N record indices, split only by
the runner) emits N values of VALUE_BYTES bytes under KEYS keys; a
GroupByKey groups them; each group is reduced to (1 key, its count, its
bytes) and the totals are checked in the pipeline: every value arrived,
exactly once, under its key.

With FAN_OUT_INPUTS > 0 the same values come instead from that many
elements, reshuffled, each emitting its share from a plain DoFn (not
splittable): a bundle whose output is far bigger than its input, which
the runner can only split at an element.

    python gbk_spill_pipeline.py ENDPOINT TOTAL_MB [VALUE_KB] [KEYS] \
        [FAN_OUT_INPUTS]

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


def record(i, value_bytes, keys):
  at = (i * 7919) % (len(BLOCK) - value_bytes)
  return b'key-%08d' % (i % keys), BLOCK[at:at + value_bytes]


class Generate(beam.DoFn):
  def __init__(self, value_bytes, keys):
    self._value_bytes = value_bytes
    self._keys = keys

  def process(self, n, tracker=beam.DoFn.RestrictionParam(Indices())):
    i = tracker.current_restriction().start
    while tracker.try_claim(i):
      yield record(i, self._value_bytes, self._keys)
      i += 1


class FanOut(beam.DoFn):
  """Input `part` of `parts` emits its share of the records."""

  def __init__(self, records, parts, value_bytes, keys):
    self._records = records
    self._parts = parts
    self._value_bytes = value_bytes
    self._keys = keys

  def process(self, part):
    first = part * self._records // self._parts
    end = (part + 1) * self._records // self._parts
    for i in range(first, end):
      yield record(i, self._value_bytes, self._keys)


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


def build(p, records, value_bytes, keys, fan_out_inputs=0):
  per_key = records // keys
  if fan_out_inputs > 0:
    values = (
        p
        | beam.Create(list(range(fan_out_inputs)))
        | beam.Reshuffle()
        | beam.ParDo(FanOut(records, fan_out_inputs, value_bytes, keys)))
  else:
    values = (
        p
        | beam.Create([records])
        | beam.ParDo(Generate(value_bytes, keys)))
  totals = (
      values
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
  fan_out_inputs = int(argv[5]) if len(argv) > 5 else 0
  value_bytes = value_kb * 1024
  records = total_mb * (1 << 20) // value_bytes
  keys = min(keys, records)
  options = PipelineOptions([
      '--runner=PortableRunner', '--job_endpoint=' + endpoint,
      '--environment_type=LOOPBACK'
  ])
  p = beam.Pipeline(options=options)
  build(p, records, value_bytes, keys, fan_out_inputs)
  result = p.run()
  print(result._job_id, flush=True)  # pylint: disable=protected-access
  state = result.wait_until_finish()
  print(state, flush=True)
  return 0 if state == 'DONE' else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv))
