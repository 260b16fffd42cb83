"""Several SDK workers per environment (`--sdk_worker_parallelism`).

Refract starts that many workers for each environment of a job and spreads
bundles over them round-robin; results are the same as with one worker.
"""

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to

from refract_testlib import RefractServer
from refract_testlib import serving


def count_words(options):
  with beam.Pipeline(options=options) as p:
    counts = (
      p
      | beam.Create(['a b', 'b c', 'c c'] * 50)
      | beam.FlatMap(str.split)
      | beam.combiners.Count.PerElement()
    )
    assert_that(counts, equal_to([('a', 50), ('b', 100), ('c', 150)]))


def workers_connected(log_path):
  with open(log_path) as f:
    return [line for line in f if 'worker connected' in line]


def test_two_workers_give_the_same_results(refract_server):
  count_words(PipelineOptions(refract_server.portable_args() + ['--sdk_worker_parallelism=2']))
  started = workers_connected(refract_server.log_path)
  assert len(started) == 2, started


def test_the_servers_count_holds_for_a_job_that_asks_for_nothing(request, refract_bin, tmp_path):
  """Python sends sdk_worker_parallelism=1 unless told otherwise: on a
  server started with a count, that count holds."""
  server = RefractServer(
    refract_bin, tmp_path / 'serve.log', extra_args=['--sdk_worker_parallelism', '2']
  )
  with serving(request, server):
    count_words(PipelineOptions(server.portable_args()))
    started = workers_connected(server.log_path)
  assert len(started) == 2, started
