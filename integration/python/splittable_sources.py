"""Splittable sources shared by the tests, the pipeline scripts and the
benchmarks.

`Offsets`, the restriction of an element N (the offsets 0..N-1), is used by
the split test (`test_splits.py`) and the GroupByKey spill pipeline
(`gbk_spill_pipeline.py`), both with LOOPBACK workers, which import it.

`Endless` and `Records`, an unbounded source of 1 KiB records as fast as it
can go, are used by the backpressure test (`test_backpressure.py`, LOOPBACK
workers, which import it) and the slow-sink memory benchmark
(`integration/bench/slow_sink_memory.py`, which pastes this file's text into
the pipeline script it runs, so PROCESS workers unpickle the classes by
value).

A pipeline whose PROCESS workers may not have this directory on their path
(recovery_pipeline.py, run as a script so that its classes travel by value)
keeps its own restriction provider.
"""

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.io.restriction_trackers import OffsetRestrictionTracker
from apache_beam.utils.timestamp import Duration


class Offsets(beam.RestrictionProvider):
  """The offsets 0..N-1 of an element N, in one restriction."""

  def initial_restriction(self, element):
    return OffsetRange(0, element)

  def create_tracker(self, restriction):
    return OffsetRestrictionTracker(restriction)

  def restriction_size(self, element, restriction):
    return restriction.size()

  def split(self, element, restriction):
    # One restriction (as Beam's default does; said here because the tests
    # rely on it): only the runner's dynamic splits divide the work.
    yield restriction


class Endless(Offsets):
  """One restriction as long as the job runs."""

  def initial_restriction(self, _):
    return OffsetRange(0, 1 << 62)


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
