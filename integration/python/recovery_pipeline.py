"""The pipeline of the fault-injection test (test_recovery.py), run as a
script so that its functions travel to PROCESS workers by value.

An unbounded, splittable source of numbered events (each step emits a few
numbers and then checkpoints itself, so the runner holds the rest as a
residual), event time 100 ms per number, fixed one-second windows, and a
stateful per-key, per-window DoFn that drops duplicate numbers, counts and
sums them in state, and emits its totals from an event-time timer at the
end of the window. A sink writes one file per (window, key) — named after
them, so writing it again writes the same file.

With --keep_all_kb K, a second stateful DoFn keeps every number with K KiB
of ballast in one bag per key in the global window, read back when the
input ends: state that grows through the whole job (past a stage's share of
a small --memory_budget, so it goes to disk beside the checkpoints), which
must hold each number exactly once, whole, however often the runner was
killed. It writes `all-KEY.json`.

    python recovery_pipeline.py --job_endpoint HOST:PORT --output DIR
        --events N --boot PATH/python_boot.sh [--experiments E ...]
        [--per_step K --pause SECONDS] [--keep_all_kb K]

With --changed, the next version of the pipeline: a step added before the
stateful DoFn (which renumbers the transforms the Python SDK names after
it), a Reshuffle before the sink (which fuses the sink into a stage of its
own) and another sink class writing the same files; a savepoint of the
first version must start it, and one that renames the stateful DoFn
(--stateful_name) must be refused unless --transform_name_mapping says so.
The same with --update --job_name NAME: the new version replaces the
running job of that name (one keyed by text, --string_keys, must be
refused: its state is kept under other bytes).

prints the job id and exits without waiting for the job.
"""

import argparse
import json
import os

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.io.restriction_trackers import OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import userstate
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Duration
from apache_beam.utils.timestamp import Timestamp

from refract_testlib import exit_now

PER_STEP = 7
MS_PER_EVENT = 100


class EventRange(beam.RestrictionProvider):
  def initial_restriction(self, n):
    return OffsetRange(0, n)

  def create_tracker(self, restriction):
    return OffsetRestrictionTracker(restriction)

  def restriction_size(self, n, restriction):
    return restriction.size()


class NumberedEvents(beam.DoFn):
  """Emits 0..n-1, `per_step` numbers per step, then defers the rest for
  `pause` seconds."""

  def __init__(self, per_step=PER_STEP, pause=0.05):
    self.per_step = per_step
    self.pause = pause

  @beam.DoFn.unbounded_per_element()
  def process(
    self,
    n,
    tracker=beam.DoFn.RestrictionParam(EventRange()),
    estimator=beam.DoFn.WatermarkEstimatorParam(ManualWatermarkEstimator.default_provider()),
  ):
    position = tracker.current_restriction().start
    end = min(position + self.per_step, tracker.current_restriction().stop)
    while position < end:
      if not tracker.try_claim(position):
        return
      ts = Timestamp(micros=position * MS_PER_EVENT * 1000)
      yield window.TimestampedValue(position, ts)
      estimator.set_watermark(ts)
      position += 1
    if position < tracker.current_restriction().stop:
      tracker.defer_remainder(Duration(seconds=self.pause))


class DedupCount(beam.DoFn):
  """Per key and window: distinct numbers, their count and sum in state,
  and a counter of distinct numbers (which recovery must not reset or
  count twice)."""

  DISTINCT = Metrics.counter('recovery', 'distinct_events')
  SEEN = userstate.BagStateSpec('seen', VarIntCoder())
  COUNT = userstate.ReadModifyWriteStateSpec('count', VarIntCoder())
  TOTAL = userstate.ReadModifyWriteStateSpec('total', VarIntCoder())
  END = userstate.TimerSpec('end', userstate.TimeDomain.WATERMARK)

  def process(
    self,
    kv,
    w=beam.DoFn.WindowParam,
    seen=beam.DoFn.StateParam(SEEN),
    count=beam.DoFn.StateParam(COUNT),
    total=beam.DoFn.StateParam(TOTAL),
    end=beam.DoFn.TimerParam(END),
  ):
    _, number = kv
    if number in set(seen.read()):
      return
    seen.add(number)
    self.DISTINCT.inc()
    count.write((count.read() or 0) + 1)
    total.write((total.read() or 0) + number)
    end.set(w.max_timestamp())

  @userstate.on_timer(END)
  def emit(
    self,
    key=beam.DoFn.KeyParam,
    w=beam.DoFn.WindowParam,
    count=beam.DoFn.StateParam(COUNT),
    total=beam.DoFn.StateParam(TOTAL),
  ):
    yield (int(w.start), key, count.read() or 0, total.read() or 0)


def ballast(number, kb):
  """`kb` KiB that say which number they belong to."""
  return number.to_bytes(4, 'big') * (kb * 256)


class KeepAll(beam.DoFn):
  """Per key: every number with its ballast, in one bag until the end of
  the global window; then the count, sum and distinct count of what the
  bag holds (failing on a ballast that is not its number's)."""

  ALL = userstate.BagStateSpec('all', VarIntCoder())
  BALLAST = userstate.BagStateSpec('ballast', beam.coders.BytesCoder())
  END = userstate.TimerSpec('end', userstate.TimeDomain.WATERMARK)

  def __init__(self, kb):
    self.kb = kb

  def process(
    self,
    kv,
    w=beam.DoFn.WindowParam,
    numbers=beam.DoFn.StateParam(ALL),
    ballasts=beam.DoFn.StateParam(BALLAST),
    end=beam.DoFn.TimerParam(END),
  ):
    _, number = kv
    numbers.add(number)
    ballasts.add(ballast(number, self.kb))
    end.set(w.max_timestamp())

  @userstate.on_timer(END)
  def emit(
    self,
    key=beam.DoFn.KeyParam,
    numbers=beam.DoFn.StateParam(ALL),
    ballasts=beam.DoFn.StateParam(BALLAST),
  ):
    kept = list(numbers.read())
    weighed = 0
    for value, number in zip(ballasts.read(), kept, strict=False):
      if value != ballast(number, self.kb):
        raise ValueError('the ballast of %d came back wrong' % number)
      weighed += 1
    if weighed != len(kept):
      raise ValueError('%d numbers, %d ballasts' % (len(kept), weighed))
    yield key, len(kept), sum(kept), len(set(kept))


class WriteAll(beam.DoFn):
  def __init__(self, output):
    self.output = output

  def process(self, result):
    key, count, total, distinct = result
    path = os.path.join(self.output, 'all-%d.json' % key)
    with open(path + '.tmp', 'w') as f:
      json.dump({'count': count, 'total': total, 'distinct': distinct}, f)
    os.replace(path + '.tmp', path)


class WriteResult(beam.DoFn):
  def __init__(self, output):
    self.output = output

  def process(self, result):
    start, key, count, total = result
    path = os.path.join(self.output, '%d-%d.json' % (start, key))
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
      json.dump({'count': count, 'total': total}, f)
    os.replace(tmp, path)


class WriteResultAgain(beam.DoFn):
  """The next version's sink: the same files, written by other code."""

  def __init__(self, output):
    self.output = output

  def process(self, result):
    start, key, count, total = result
    path = os.path.join(self.output, '%d-%d.json' % (start, key))
    with open(path + '.next', 'w') as f:
      f.write(json.dumps({'total': total, 'count': count}))
    os.replace(path + '.next', path)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--job_endpoint', required=True)
  parser.add_argument('--output', required=True)
  parser.add_argument('--events', type=int, required=True)
  parser.add_argument('--boot', required=True)
  parser.add_argument('--experiments', action='append', default=[])
  parser.add_argument('--per_step', type=int, default=PER_STEP)
  parser.add_argument('--pause', type=float, default=0.05)
  parser.add_argument('--keep_all_kb', type=int, default=0)
  parser.add_argument('--changed', action='store_true')
  parser.add_argument('--stateful_name', default='DedupCount')
  parser.add_argument('--transform_name_mapping')
  parser.add_argument('--job_name')
  parser.add_argument('--update', action='store_true')
  parser.add_argument('--string_keys', action='store_true')
  args = parser.parse_args()
  options = PipelineOptions(
    [
      '--runner=PortableRunner',
      '--job_endpoint=' + args.job_endpoint,
      '--streaming',
      '--environment_type=PROCESS',
      '--environment_config=' + json.dumps({'command': args.boot}),
    ]
    + ['--experiments=' + e for e in args.experiments]
    + (
      ['--transform_name_mapping=' + args.transform_name_mapping]
      if args.transform_name_mapping
      else []
    )
    + (['--job_name=' + args.job_name] if args.job_name else [])
    + (['--update'] if args.update else [])
  )
  p = beam.Pipeline(options=options)
  to_key = beam.Map(lambda i: (i % 3, i))
  if args.string_keys:
    to_key = beam.Map(lambda i: (str(i % 3), i))
  keyed = (
    p
    | beam.Create([args.events])
    | 'Events' >> beam.ParDo(NumberedEvents(args.per_step, args.pause))
    | 'Key' >> to_key
  )
  if args.keep_all_kb:
    _ = (
      keyed
      | 'KeepAll' >> beam.ParDo(KeepAll(args.keep_all_kb))
      | 'WriteAll' >> beam.ParDo(WriteAll(args.output))
    )
  if args.changed:
    keyed = keyed | 'Checked' >> beam.Map(lambda kv: (kv[0], abs(kv[1])))
  counted = (
    keyed | beam.WindowInto(window.FixedWindows(1)) | args.stateful_name >> beam.ParDo(DedupCount())
  )
  if args.changed:
    counted = counted | beam.Reshuffle()
    _ = counted | 'Write' >> beam.ParDo(WriteResultAgain(args.output))
  else:
    _ = counted | 'Write' >> beam.ParDo(WriteResult(args.output))
  result = p.run()
  print(result._job_id, flush=True)
  # Leaves the job running: gRPC's threads, still following it, must not
  # hold the exit up (seen once: the client hung at exit past the test's
  # 120 s limit).
  exit_now(0)


if __name__ == '__main__':
  main()
