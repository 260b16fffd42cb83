"""`refract jobs`, `refract status` and `refract logs` against a server."""

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from refract_testlib import refract_cli


def count(x):
  Metrics.counter('words', 'seen').inc()
  return x


def test_jobs_status_and_logs(refract_server, refract_bin):
  p = beam.Pipeline(options=PipelineOptions(refract_server.portable_args()))
  _ = p | beam.Create(['a', 'b', 'c']) | 'Count' >> beam.Map(count)
  result = p.run()
  result.wait_until_finish()
  job = result._job_id

  listed = refract_cli(refract_bin, refract_server, 'jobs').stdout
  assert any(line.split('\t')[:2] == [job, 'DONE'] for line in listed.splitlines()), listed

  status = refract_cli(refract_bin, refract_server, 'status', job).stdout
  assert status.splitlines()[0] == '%s: DONE' % job, status
  assert 'Count words:seen sum_int64:v1 = 3' in status, status

  logs = refract_cli(refract_bin, refract_server, 'logs', job).stdout
  assert 'state RUNNING' in logs and logs.rstrip().endswith('state DONE'), logs


def test_an_unknown_job_is_an_error(refract_server, refract_bin):
  done = refract_cli(refract_bin, refract_server, 'status', 'no-such-job', check=False)
  assert done.returncode != 0
  assert 'no-such-job' in done.stderr
