"""Several SDK workers per environment (`--sdk_worker_parallelism`).

Refract starts that many workers for each environment of a job and spreads
bundles over them round-robin; results are the same as with one worker.
"""

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to


def test_two_workers_give_the_same_results(refract_server):
  options = PipelineOptions(
      refract_server.portable_args() + ['--sdk_worker_parallelism=2'])
  with beam.Pipeline(options=options) as p:
    counts = (
        p
        | beam.Create(['a b', 'b c', 'c c'] * 50)
        | beam.FlatMap(str.split)
        | beam.combiners.Count.PerElement())
    assert_that(counts, equal_to([('a', 50), ('b', 100), ('c', 150)]))
  with open(refract_server.log_path) as f:
    started = [line for line in f if 'worker connected' in line]
  assert len(started) == 2, started
