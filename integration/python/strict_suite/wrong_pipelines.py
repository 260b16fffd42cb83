"""Test pipelines that are wrong in the ways strict mode looks for, and one
that is right; each passes on Beam's DirectRunner. Collected only by
test_strict_mode.py, which runs them in pytest sessions of their own.

- DedupeInMemory: not idempotent (a bundle run again loses its elements);
- CountPerBundle: relies on bundle boundaries (one bundle, all input);
- PairWithPrevious: relies on input order within a bundle;
- LabelledPoint with LosslessLookingCoder: a coder that loses a field.
  It passes wherever the two Maps are fused (the SDK hands elements from
  one to the next as objects); a runner that puts a stage boundary between
  them (strict mode with `refract_strict=coders`) encodes every element
  there. (An element its coder cannot encode at
  all fails on every runner: Beam Python's harness samples element sizes by
  encoding them, the first ones always.)
"""

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue


class DedupeInMemory(beam.DoFn):
  """Drops elements it has seen before: in its own memory, so an element
  whose bundle runs again is dropped the second time."""

  def setup(self):
    self.seen = set()

  def process(self, x):
    if x not in self.seen:
      self.seen.add(x)
      yield x


def check_dedupe_in_memory():
  with TestPipeline() as p:
    assert_that(
      p | beam.Create(['a', 'b', 'c']) | 'DedupeInMemory' >> beam.ParDo(DedupeInMemory()),
      equal_to(['a', 'b', 'c']),
    )


class CountPerBundle(beam.DoFn):
  """Counts its input as if a bundle were all of it."""

  def start_bundle(self):
    self.n = 0

  def process(self, x):
    self.n += 1

  def finish_bundle(self):
    yield WindowedValue(self.n, GlobalWindow().max_timestamp(), [GlobalWindow()])


def check_count_per_bundle():
  with TestPipeline() as p:
    assert_that(
      p | beam.Create(['a', 'b', 'c']) | 'CountPerBundle' >> beam.ParDo(CountPerBundle()),
      equal_to([3]),
    )


class PairWithPrevious(beam.DoFn):
  """Pairs each element with the one before it, as if input kept its order."""

  def start_bundle(self):
    self.previous = None

  def process(self, x):
    yield (self.previous, x)
    self.previous = x


def check_pairs_in_arrival_order():
  with TestPipeline() as p:
    assert_that(
      p | beam.Create(['a', 'b', 'c']) | 'PairWithPrevious' >> beam.ParDo(PairWithPrevious()),
      equal_to([(None, 'a'), ('a', 'b'), ('b', 'c')]),
    )


class LabelledPoint:
  """A point with a label its registered coder forgets."""

  def __init__(self, x, label):
    self.x = x
    self.label = label


class LosslessLookingCoder(beam.coders.Coder):
  """Encodes a LabelledPoint's x and nothing else."""

  def encode(self, value):
    return str(value.x).encode()

  def decode(self, encoded):
    return LabelledPoint(int(encoded), None)

  def is_deterministic(self):
    return True


beam.coders.registry.register_coder(LabelledPoint, LosslessLookingCoder)


def check_a_coder_that_loses_data():
  with TestPipeline() as p:
    points = (
      p
      | beam.Create([1, 2])
      | 'Label' >> beam.Map(lambda x: LabelledPoint(x, 'p%d' % x)).with_output_types(LabelledPoint)
    )
    assert_that(points | 'ReadLabel' >> beam.Map(lambda point: point.label), equal_to(['p1', 'p2']))


def check_a_correct_pipeline_passes():
  with TestPipeline() as p:
    assert_that(
      p | beam.Create(['a', 'b', 'a', 'c']) | beam.Distinct() | beam.combiners.Count.Globally(),
      equal_to([3]),
    )
