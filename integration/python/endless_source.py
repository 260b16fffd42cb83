"""An unbounded splittable source of 1 KiB records, as fast as it can go.

Shared by the backpressure test (`test_backpressure.py`, LOOPBACK workers,
which import it) and the slow-sink memory benchmark
(`integration/bench/slow_sink_memory.py`, which pastes this file's text into
the pipeline script it runs, so PROCESS workers unpickle the classes by
value).
"""

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.io.restriction_trackers import OffsetRestrictionTracker
from apache_beam.utils.timestamp import Duration


class Endless(beam.RestrictionProvider):
  """One restriction as long as the job runs."""

  def initial_restriction(self, _):
    return OffsetRange(0, 1 << 62)

  def create_tracker(self, restriction):
    return OffsetRestrictionTracker(restriction)

  def restriction_size(self, _, restriction):
    return restriction.size()


class Records(beam.DoFn):
  """Emits `per_step` records (its position, then 1000 bytes), then defers
  the rest of its restriction at once: a self-checkpoint per step."""

  def __init__(self, per_step):
    self._per_step = per_step

  @beam.DoFn.unbounded_per_element()
  def process(self, _, tracker=beam.DoFn.RestrictionParam(Endless())):
    position = tracker.current_restriction().start
    for _ in range(self._per_step):
      if not tracker.try_claim(position):
        return
      yield b'%d ' % position + b'x' * 1000
      position += 1
    tracker.defer_remainder(Duration(seconds=0))
