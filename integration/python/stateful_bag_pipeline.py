"""A batch stateful DoFn that buffers its input in user state, for the
user-state memory benchmark (integration/bench/stateful_memory.py).

Four reshuffled elements each generate a quarter of N records of
VALUE_BYTES incompressible bytes under KEYS keys; a stateful DoFn appends
each record's value to its key's bag and sets an event-time timer at the
end of the window, which reads the bag back, counts it and clears it (what
`GroupIntoBatches` and hand-written buffering DoFns do). The totals are
checked in the pipeline: every value was buffered and read back once.

    python stateful_bag_pipeline.py ENDPOINT TOTAL_MB [VALUE_KB] [KEYS] [MODE]

MODE is `batch` (the default) or `streaming` (the same pipeline submitted
with --streaming: its state is streaming state, its timers fire when the
watermark passes the end of the bounded input). Prints the job id, waits
for the job and exits 0 when it is DONE.
"""

import os
import sys
import typing

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec
from apache_beam.transforms.userstate import TimerSpec
from apache_beam.transforms.userstate import on_timer
from refract_testlib import run_pipeline_to_end

# Random bytes, sliced at different offsets: values that do not compress.
BLOCK = os.urandom(1 << 20)
PARTS = 4
KV = typing.Tuple[bytes, bytes]


class Generate(beam.DoFn):
  """Part `part` of PARTS emits every PARTS-th record."""

  def __init__(self, records, value_bytes, keys):
    self._records = records
    self._value_bytes = value_bytes
    self._keys = keys

  def process(self, part):
    for i in range(part, self._records, PARTS):
      at = (i * 7919) % (len(BLOCK) - self._value_bytes)
      yield b'key-%08d' % (i % self._keys), BLOCK[at : at + self._value_bytes]


class BufferPerKey(beam.DoFn):
  """Keeps a key's values in a bag until the window ends."""

  BAG = BagStateSpec('bag', BytesCoder())
  FLUSH = TimerSpec('flush', TimeDomain.WATERMARK)

  def process(
    self,
    kv,
    bag=beam.DoFn.StateParam(BAG),
    flush=beam.DoFn.TimerParam(FLUSH),
    window=beam.DoFn.WindowParam,
  ):
    bag.add(kv[1])
    flush.set(window.max_timestamp())

  @on_timer(FLUSH)
  def flushed(self, bag=beam.DoFn.StateParam(BAG)):
    count = size = 0
    for value in bag.read():
      count += 1
      size += len(value)
    bag.clear()
    yield count, size


def add(rows):
  count = size = 0
  for c, s in rows:
    count += c
    size += s
  return count, size


def main(argv):
  # Arguments starting with -- are pipeline options (an experiment, say).
  extra = [a for a in argv[1:] if a.startswith('--')]
  argv = [a for a in argv if not a.startswith('--')]
  endpoint, total_mb = argv[1], int(argv[2])
  value_kb = int(argv[3]) if len(argv) > 3 else 1
  keys = int(argv[4]) if len(argv) > 4 else 100000
  mode = argv[5] if len(argv) > 5 else 'batch'
  if mode not in ('batch', 'streaming'):
    raise SystemExit('MODE must be batch or streaming, not %r' % mode)
  value_bytes = value_kb * 1024
  records = total_mb * (1 << 20) // value_bytes
  flags = ['--runner=PortableRunner', '--job_endpoint=' + endpoint, '--environment_type=LOOPBACK']
  if mode == 'streaming':
    flags.append('--streaming')
  options = PipelineOptions(flags + extra)
  p = beam.Pipeline(options=options)
  totals = (
    p
    | beam.Create(list(range(PARTS)))
    | beam.Reshuffle()
    | beam.ParDo(Generate(records, value_bytes, keys)).with_output_types(KV)
    | beam.ParDo(BufferPerKey())
    | beam.CombineGlobally(add)
  )
  assert_that(totals, equal_to([(records, records * value_bytes)]))
  return run_pipeline_to_end(p)


if __name__ == '__main__':
  sys.exit(main(sys.argv))
