"""Runner-initiated splits of a splittable DoFn's bundle.

A bundle of a splittable DoFn that runs for more than a second is asked to
split at half of its remaining work, and every second after that to keep
1% of what is left (a bundle's output waits in the runner until it commits,
so no bundle may read for long); the SDK keeps the primary and hands back
the residual restriction, which Refract starts as a bundle of its own at
once. Every
offset is still produced exactly once.
"""

import time

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.io.restriction_trackers import OffsetRestrictionTracker
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
from apache_beam.transforms.core import RestrictionProvider

COUNT = 30


class Offsets(RestrictionProvider):
  def initial_restriction(self, element):
    return OffsetRange(0, element)

  def create_tracker(self, restriction):
    return OffsetRestrictionTracker(restriction)

  def restriction_size(self, element, restriction):
    return restriction.size()


class SlowRange(beam.DoFn):
  def start_bundle(self):
    Metrics.counter('splits', 'bundles').inc()

  def process(
      self, element, tracker=beam.DoFn.RestrictionParam(Offsets())):
    position = tracker.current_restriction().start
    while tracker.try_claim(position):
      time.sleep(0.1)
      yield position
      position += 1


def test_a_long_bundle_is_split_and_nothing_is_lost_or_repeated(
    refract_server):
  p = beam.Pipeline(options=PipelineOptions(refract_server.portable_args()))
  out = p | beam.Create([COUNT]) | beam.ParDo(SlowRange())
  assert_that(out, equal_to(list(range(COUNT))))
  result = p.run()
  result.wait_until_finish()
  bundles = result.metrics().query(
      beam.metrics.MetricsFilter().with_name('bundles'))['counters']
  assert sum(c.committed for c in bundles) >= 2, bundles
