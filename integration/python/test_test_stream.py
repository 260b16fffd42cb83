"""TestStream (`beam:transform:teststream:v1`) replayed by Refract.

Refract's engine replays the scripted events itself, one at a time, each
only once the pipeline has finished reacting to the previous one: elements,
watermark advances (which fire windows and event-time timers) and
processing-time advances (which fire processing-time triggers and timers
against the runner's clock, not the wall clock).
"""

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
from apache_beam.transforms import trigger
from apache_beam.transforms import userstate
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain


@pytest.fixture(
  params=[(1, None), (3, 'board'), (3, 'grpc')],
  ids=['one-engine', 'three-shards', 'three-shards-grpc'],
)
def shards(request):
  """Each pipeline runs on one engine and on three shards
  (`refract_shards`), where the stream is replayed by shard 0 and each
  event applied only once every shard is quiet: shards joined in memory,
  and exchanging over gRPC (where the quiet detector decides it)."""
  return request.param


def streaming_options(server, shards):
  count, exchange = shards
  sharding = []
  if count > 1:
    sharding = [
      '--experiments=refract_shards=%d' % count,
      '--experiments=refract_shard_exchange=' + exchange,
    ]
  return PipelineOptions(server.portable_args('--streaming', *sharding))


def describe_pane(kv, w=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
  return (kv[0], sorted(kv[1]), int(w.start), pane.timing, pane.index)


def test_on_time_and_late_panes(refract_server, shards):
  tv = window.TimestampedValue
  stream = (
    TestStream()
    .add_elements([tv(('k', 1), 1), tv(('k', 2), 2)])
    .advance_watermark_to(15)
    .add_elements([tv(('k', 3), 3)])  # late for [0, 10), within lateness
    .add_elements([tv(('k', 20), 20)])
    .advance_watermark_to_infinity()
  )
  with beam.Pipeline(options=streaming_options(refract_server, shards)) as p:
    out = (
      p
      | stream
      | beam.WindowInto(
        window.FixedWindows(10),
        allowed_lateness=100,
        trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
      )
      | beam.GroupByKey()
      | beam.Map(describe_pane)
    )
    on_time, late = (
      beam.utils.windowed_value.PaneInfoTiming.ON_TIME,
      beam.utils.windowed_value.PaneInfoTiming.LATE,
    )
    assert_that(
      out,
      equal_to(
        [
          ('k', [1, 2], 0, on_time, 0),
          ('k', [3], 0, late, 1),
          ('k', [20], 20, on_time, 0),
        ]
      ),
    )


class TimerDoFn(beam.DoFn):
  EVENT = userstate.TimerSpec('event', TimeDomain.WATERMARK)
  REAL = userstate.TimerSpec('real', TimeDomain.REAL_TIME)

  def process(
    self,
    element,
    t=beam.DoFn.TimestampParam,
    event=beam.DoFn.TimerParam(EVENT),
    real=beam.DoFn.TimerParam(REAL),
  ):
    event.set(t + 5)
    # An hour of processing time: only the TestStream's clock gets there.
    real.set(beam.utils.timestamp.Timestamp.now() + 3600)

  @userstate.on_timer(EVENT)
  def on_event(self, key=beam.DoFn.KeyParam):
    yield ('event', key)

  @userstate.on_timer(REAL)
  def on_real(self, key=beam.DoFn.KeyParam):
    yield ('processing', key)


def test_timers_fire_on_watermark_and_processing_time_advances(refract_server, shards):
  stream = (
    TestStream()
    .add_elements([window.TimestampedValue(('a', 0), 10)])
    .advance_watermark_to(20)
    .advance_processing_time(7200)
    .add_elements([window.TimestampedValue(('b', 0), 30)])
    .advance_watermark_to_infinity()
  )
  with beam.Pipeline(options=streaming_options(refract_server, shards)) as p:
    out = p | stream | beam.ParDo(TimerDoFn())
    assert_that(
      out, equal_to([('event', 'a'), ('processing', 'a'), ('event', 'b'), ('processing', 'b')])
    )


def test_data_later_than_allowed_lateness_is_dropped_and_counted(refract_server, shards):
  tv = window.TimestampedValue
  stream = (
    TestStream()
    .add_elements([tv(('k', 1), 1)])
    .advance_watermark_to(30)
    .add_elements([tv(('k', 2), 2)])  # its window closed at 10 + 5
    .advance_watermark_to_infinity()
  )
  p = beam.Pipeline(options=streaming_options(refract_server, shards))
  out = (
    p
    | stream
    | beam.WindowInto(window.FixedWindows(10), allowed_lateness=5)
    | beam.GroupByKey()
    | beam.MapTuple(lambda k, vs: (k, sorted(vs)))
  )
  assert_that(out, equal_to([('k', [1])]))
  result = p.run()
  result.wait_until_finish()
  counters = result.metrics().query(beam.metrics.MetricsFilter().with_name('droppedDueToLateness'))[
    'counters'
  ]
  assert [c.committed for c in counters] == [1]


def test_windowed_cogroupbykey_of_two_test_streams(refract_server, shards):
  tv = window.TimestampedValue
  orders = (
    TestStream()
    .add_elements([tv(('alice', 'book'), 1)])
    .advance_watermark_to(5)
    .add_elements([tv(('bob', 'pen'), 6), tv(('alice', 'lamp'), 12)])
    .advance_watermark_to_infinity()
  )
  payments = (
    TestStream()
    .add_elements([tv(('alice', 30), 2)])
    .advance_watermark_to(11)
    .add_elements([tv(('alice', 12), 13)])
    .advance_watermark_to_infinity()
  )
  with beam.Pipeline(options=streaming_options(refract_server, shards)) as p:

    def fixed():
      return beam.WindowInto(window.FixedWindows(10))

    joined = (
      {
        'orders': p | 'Orders' >> orders | 'WO' >> fixed(),
        'payments': p | 'Payments' >> payments | 'WP' >> fixed(),
      }
      | beam.CoGroupByKey()
      | beam.Map(
        lambda kv, w=beam.DoFn.WindowParam: (
          kv[0],
          int(w.start),
          sorted(kv[1]['orders']),
          sorted(kv[1]['payments']),
        )
      )
    )
    assert_that(
      joined,
      equal_to(
        [
          ('alice', 0, ['book'], [30]),
          ('bob', 0, ['pen'], []),
          ('alice', 10, ['lamp'], [12]),
        ]
      ),
    )
