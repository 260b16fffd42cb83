"""Ordered list user state (Python's OrderedListStateSpec) on Refract.

Elements add (sort key, value) entries in their bundles; three event-time
timers, each set by the previous one and so fired in later bundles, then
read, range-read and range-clear the list. Every read of committed entries
goes through Refract's state service, so this checks appends, sorting
(including negative sort keys), ranged gets, ranged clears and full clears
across bundle commits.
"""

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp

VALUES = {
  'a': [7, -3, 12, 0, 25, 3, 12, -5, 18, -400],
  'b': [2, 1],
}


def sort_key(v):
  # Microsecond sort keys, negative ones included (ten-byte varints).
  return Timestamp(micros=v * 1000003)


class OrderedListDoFn(beam.DoFn):
  LIST = userstate.OrderedListStateSpec('list', VarIntCoder())
  FLUSH = userstate.TimerSpec('flush', TimeDomain.WATERMARK)
  CHECK = userstate.TimerSpec('check', TimeDomain.WATERMARK)
  FINAL = userstate.TimerSpec('final', TimeDomain.WATERMARK)

  def process(self, element, lst=beam.DoFn.StateParam(LIST), flush=beam.DoFn.TimerParam(FLUSH)):
    _, v = element
    lst.add((sort_key(v), v))
    flush.set(50)

  @userstate.on_timer(FLUSH)
  def on_flush(
    self, key=beam.DoFn.KeyParam, lst=beam.DoFn.StateParam(LIST), check=beam.DoFn.TimerParam(CHECK)
  ):
    yield ('all', key, [v for _, v in lst.read()])
    in_range = lst.read_range(sort_key(0), sort_key(13))
    yield ('range', key, [v for _, v in in_range])
    lst.clear_range(sort_key(-5), sort_key(4))
    check.set(60)

  @userstate.on_timer(CHECK)
  def on_check(
    self, key=beam.DoFn.KeyParam, lst=beam.DoFn.StateParam(LIST), final=beam.DoFn.TimerParam(FINAL)
  ):
    yield ('after_clear_range', key, [v for _, v in lst.read()])
    lst.add((sort_key(100), 100))
    yield ('with_new', key, [v for _, v in lst.read()])
    lst.clear()
    lst.add((sort_key(-1), 2000))
    final.set(70)

  @userstate.on_timer(FINAL)
  def on_final(self, key=beam.DoFn.KeyParam, lst=beam.DoFn.StateParam(LIST)):
    yield ('final', key, [v for _, v in lst.read()])
    lst.clear()


def expected():
  out = []
  for key, values in VALUES.items():
    ordered = sorted(values)  # stable, like the runner
    out.append(('all', key, ordered))
    out.append(('range', key, [v for v in ordered if 0 <= v < 13]))
    kept = [v for v in ordered if not -5 <= v < 4]
    out.append(('after_clear_range', key, kept))
    out.append(('with_new', key, sorted(kept + [100])))
    out.append(('final', key, [2000]))
  return out


def test_ordered_list_state_across_bundles(refract_server):
  elements = [(k, v) for k, vs in VALUES.items() for v in vs]
  with beam.Pipeline(options=PipelineOptions(refract_server.portable_args())) as p:
    out = (
      p
      | beam.Create(elements)
      | beam.Map(lambda kv: window.TimestampedValue(kv, 10))
      | beam.WindowInto(window.FixedWindows(100))
      | beam.ParDo(OrderedListDoFn())
    )
    assert_that(out, equal_to(expected()))
