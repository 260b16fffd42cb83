"""Dump Beam Pipeline protos, as the Python SDK submits them, for
refract-translate's tests.

Re-run after changing a pipeline (or upgrading the SDK):

    python3 runner/translate/tests/data/gen_pipelines.py

Every pipeline below is built with the installed Python SDK (2.77.0) and
turned into a `beam_runner_api_pb2.Pipeline` exactly as `PortableRunner`
does it before `Prepare` (`PortableRunner.get_proto_pipeline`: to_runner_api
with the options' environment, then `_optimize_pipeline`, which pre-lifts
combiners in batch). The environment is EXTERNAL, which is what a LOOPBACK
job looks like by the time the runner sees it. Each proto is written to
`<name>.pb` next to this script with `SerializeToString()`.

Nothing is executed: building the pipeline graph is enough. Pickled payloads
differ from run to run, so regenerated files always show as changed; the
tests rely only on the pipelines' structure (transform names, URNs, coders).

`check_descriptors.py` (next to this script) feeds the descriptors Refract
builds from these pipelines back into the Python SDK harness.
"""

import os
import sys

import apache_beam as beam
from apache_beam.coders import coders
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.io.restriction_trackers import OffsetRestrictionTracker
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.portable_runner import PortableRunner
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger
from apache_beam.transforms import userstate
from apache_beam.transforms import window
from apache_beam.transforms.core import RestrictionProvider

OUT_DIR = os.path.dirname(os.path.abspath(__file__))


def options(streaming=False, extra=()):
  args = [
    '--runner=PortableRunner',
    '--environment_type=EXTERNAL',
    '--environment_config=localhost:50000',
  ]
  if streaming:
    args.append('--streaming')
  return PipelineOptions(args + list(extra))


def dump(name, build, streaming=False, mutate=None, extra=()):
  opts = options(streaming, extra)
  p = beam.Pipeline(options=opts)
  build(p)
  proto = PortableRunner.get_proto_pipeline(p, opts)
  if mutate is not None:
    mutate(proto)
  path = os.path.join(OUT_DIR, name + '.pb')
  with open(path, 'wb') as f:
    f.write(proto.SerializeToString())
  print('wrote %s (%d bytes)' % (path, os.path.getsize(path)))


# --- pipelines ---------------------------------------------------------------


def create_map_gbk(p):
  _ = (
    p
    | 'Create' >> beam.Create([1, 2, 3, 4, 5])
    | 'KeyBy' >> beam.Map(lambda x: (x % 2, x))
    | 'Group' >> beam.GroupByKey()
    | 'Sum' >> beam.MapTuple(lambda k, vs: (k, sum(vs)))
  )


def side_inputs(p):
  main = p | 'Main' >> beam.Create(['a', 'b'])
  side_list = p | 'SideList' >> beam.Create([1, 2, 3])
  side_dict = p | 'SideDict' >> beam.Create([('a', 1), ('b', 2)])
  _ = main | 'UseSides' >> beam.Map(
    lambda x, values, d: (x, sum(values), d.get(x)),
    beam.pvalue.AsList(side_list),
    beam.pvalue.AsMultiMap(side_dict),
  )


class StatefulWithTimers(beam.DoFn):
  """A keyed DoFn with a bag, an event-time and a processing-time timer."""

  BUFFER = userstate.BagStateSpec('buffer', coders.PickleCoder())
  COUNT = userstate.CombiningValueStateSpec('count', combine_fn=sum)
  FLUSH = userstate.TimerSpec('flush', userstate.TimeDomain.WATERMARK)
  STALE = userstate.TimerSpec('stale', userstate.TimeDomain.REAL_TIME)

  def process(
    self,
    element,
    buffer=beam.DoFn.StateParam(BUFFER),
    count=beam.DoFn.StateParam(COUNT),
    flush=beam.DoFn.TimerParam(FLUSH),
    stale=beam.DoFn.TimerParam(STALE),
  ):
    buffer.add(element[1])
    count.add(1)
    flush.set(100)
    stale.set(0)

  @userstate.on_timer(FLUSH)
  def on_flush(self, buffer=beam.DoFn.StateParam(BUFFER)):
    yield sum(buffer.read())
    buffer.clear()

  @userstate.on_timer(STALE)
  def on_stale(self):
    return []


class MyKey(object):
  def __init__(self, k):
    self.k = k


class MyKeyCoder(coders.Coder):
  """A key coder only Python understands (pickled on the wire)."""

  def encode(self, value):
    return str(value.k).encode('utf-8')

  def decode(self, encoded):
    return MyKey(encoded.decode('utf-8'))

  def is_deterministic(self):
    return True


def stateful_timers(p):
  _ = (
    p
    | 'Create' >> beam.Create([('a', 1), ('b', 2), ('a', 3)])
    | 'Window' >> beam.WindowInto(window.FixedWindows(10))
    | 'Stateful' >> beam.ParDo(StatefulWithTimers())
    | 'After' >> beam.Map(lambda x: x)
  )


def stateful_custom_key(p):
  _ = (
    p
    | 'Create' >> beam.Create([1, 2])
    | 'CustomKey'
    >> beam.Map(lambda x: (MyKey(x), x)).with_output_types(beam.typehints.KV[MyKey, int])
    | 'Stateful' >> beam.ParDo(StatefulWithTimers())
  )


class CountingRestrictions(RestrictionProvider):
  """Restrictions for CountingSdf: the offsets [0, n) of element n."""

  def initial_restriction(self, element):
    return OffsetRange(0, element)

  def create_tracker(self, restriction):
    return OffsetRestrictionTracker(restriction)

  def restriction_size(self, element, restriction):
    return restriction.size()


class CountingSdf(beam.DoFn):
  """Emits offset + i for i in range(n), splittably."""

  def process(self, element, offset, tracker=beam.DoFn.RestrictionParam(CountingRestrictions())):
    pos = tracker.current_restriction().start
    while tracker.try_claim(pos):
      yield offset + pos
      pos += 1


def sdf(p):
  side = p | 'Side' >> beam.Create([10])
  _ = (
    p
    | 'Create' >> beam.Create([3, 4])
    | 'Double' >> beam.Map(lambda x: x * 2)
    | 'Count' >> beam.ParDo(CountingSdf(), beam.pvalue.AsSingleton(side))
    | 'Format' >> beam.Map(str)
  )


def read_text(p):
  _ = (
    p
    | 'Read' >> beam.io.ReadFromText('/nonexistent/input*.txt', validate=False)
    | 'Upper' >> beam.Map(lambda s: s.upper())
  )


def flatten_twice(p):
  pc = p | 'Create' >> beam.Create([1, 2])
  other = p | 'Other' >> beam.Create(['x'])
  _ = (pc, pc, other) | 'Flatten' >> beam.Flatten() | 'Print' >> beam.Map(str)


def combine_per_key(p):
  _ = (
    p
    | 'Create' >> beam.Create([('a', 1), ('b', 2), ('a', 3)])
    | 'Sum' >> beam.CombinePerKey(sum)
    | 'Format' >> beam.MapTuple(lambda k, v: '%s=%s' % (k, v))
  )


def combine_after_count(p):
  _ = (
    p
    | 'Create' >> beam.Create([('a', 1), ('b', 2), ('a', 3)])
    | 'Window'
    >> beam.WindowInto(
      window.FixedWindows(10),
      trigger=trigger.Repeatedly(trigger.AfterCount(2)),
      accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
    )
    | 'Sum' >> beam.CombinePerKey(sum)
  )


def windowing(p):
  base = p | 'Create' >> beam.Create([('a', 1), ('b', 2)])
  _ = (
    base
    | 'Fixed'
    >> beam.WindowInto(
      window.FixedWindows(60, offset=5),
      trigger=trigger.AfterWatermark(
        early=trigger.AfterProcessingTime(10), late=trigger.AfterCount(1)
      ),
      accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
      allowed_lateness=30,
    )
    | 'GroupFixed' >> beam.GroupByKey()
  )
  _ = (
    base
    | 'Sliding' >> beam.WindowInto(window.SlidingWindows(30, 10))
    | 'GroupSliding' >> beam.GroupByKey()
  )
  _ = (
    base
    | 'Sessions'
    >> beam.WindowInto(
      window.Sessions(15),
      trigger=trigger.Repeatedly(
        trigger.AfterAny(trigger.AfterCount(3), trigger.AfterProcessingTime(5))
      ),
      accumulation_mode=trigger.AccumulationMode.DISCARDING,
    )
    | 'GroupSessions' >> beam.GroupByKey()
  )


class OpaqueWindowCoder(coders.Coder):
  """A window coder only Python understands (pickled on the wire)."""

  def encode(self, w):
    return b'%d:%d' % (w.start.micros, w.end.micros)

  def decode(self, encoded):
    start, end = encoded.split(b':')
    return window.IntervalWindow(
      window.Timestamp(micros=int(start)), window.Timestamp(micros=int(end))
    )

  def is_deterministic(self):
    return True


class OneWindowFn(window.NonMergingWindowFn):
  """A custom (pickled) WindowFn with its own window coder."""

  def assign(self, context):
    return [window.IntervalWindow(0, 1000)]

  def get_window_coder(self):
    return OpaqueWindowCoder()


class MergeAllWindowFn(window.WindowFn):
  """A custom merging WindowFn."""

  def assign(self, context):
    return [window.IntervalWindow(context.timestamp, context.timestamp + 1)]

  def merge(self, merge_context):
    pass

  def get_window_coder(self):
    return coders.IntervalWindowCoder()


def custom_windows(p):
  base = p | 'Create' >> beam.Create([('a', 1), ('b', 2)])
  _ = base | 'Custom' >> beam.WindowInto(OneWindowFn()) | 'GroupCustom' >> beam.GroupByKey()
  _ = base | 'Merging' >> beam.WindowInto(MergeAllWindowFn()) | 'GroupMerging' >> beam.GroupByKey()


def test_stream(p):
  _ = (
    p
    | 'TestStream' >> TestStream().add_elements([1, 2]).advance_watermark_to_infinity()
    | 'Print' >> beam.Map(str)
  )


def side_input_downstream(p):
  """The side input is computed from the consumer's own main input, so the
  consumer must not be fused with the producer of that main input."""
  main = p | 'Create' >> beam.Create([1, 2, 3]) | 'Square' >> beam.Map(lambda x: x * x)
  total = main | 'Total' >> beam.CombineGlobally(sum)
  _ = main | 'Share' >> beam.Map(lambda x, t: x / t, beam.pvalue.AsSingleton(total))


def flatten_gbk_output(p):
  grouped = p | 'Create' >> beam.Create([(1, 2), (1, 3)]) | 'Group' >> beam.GroupByKey()
  other = p | 'Other' >> beam.Create([(5, [6])])
  _ = (grouped, other) | 'Flatten' >> beam.Flatten() | 'Print' >> beam.Map(str)


def set_unknown_urn(proto):
  for t in proto.components.transforms.values():
    if t.unique_name == 'KeyBy':
      t.spec.urn = 'beam:transform:foo:v1'
      return
  raise RuntimeError('KeyBy not found')


def main():
  dump('create_map_gbk', create_map_gbk)
  dump('side_inputs', side_inputs)
  dump('stateful_timers', stateful_timers)
  dump('stateful_custom_key', stateful_custom_key)
  dump('sdf', sdf)
  dump('read_text', read_text)
  dump('flatten_twice', flatten_twice)
  dump('combine_batch', combine_per_key)
  dump('combine_streaming', combine_per_key, streaming=True)
  dump('combine_after_count_streaming', combine_after_count, streaming=True)
  dump('windowing', windowing)
  dump('custom_windows', custom_windows)
  dump('test_stream', test_stream, streaming=True)
  dump('side_input_downstream', side_input_downstream)
  dump('flatten_gbk_output', flatten_gbk_output)
  dump('unknown_urn', create_map_gbk, mutate=set_unknown_urn)


if __name__ == '__main__':
  sys.exit(main())
