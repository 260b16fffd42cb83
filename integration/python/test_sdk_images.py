"""DOCKER environments without Docker: a Python pipeline submitted with
`--environment_type=DOCKER` names Beam's Python SDK image; with no Docker
engine here, Refract runs that image's harness in a local interpreter with
the same Python and Beam versions (`--sdk_python`), with the job's staged
files (the pickled main session) in place. Without such an interpreter the
job fails saying what was looked for. (Java's image runs the same way in
test_xlang.py, runner `refract-sdk-image`.)
"""

import shutil
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to

from refract_testlib import RefractServer


def docker_engine_reachable():
  if shutil.which('docker') is None:
    return False
  try:
    return (
      subprocess.run(['docker', 'info'], capture_output=True, timeout=15, check=False).returncode
      == 0
    )
  except subprocess.TimeoutExpired:
    return False


pytestmark = pytest.mark.skipif(
  docker_engine_reachable(), reason='a Docker engine is reachable: DOCKER environments use it'
)


def serve(request, refract_bin, tmp_path, *extra):
  server = RefractServer(
    refract_bin, tmp_path / 'refract.log', extra_args=['--serve_http=false'] + list(extra)
  )
  request.node.refract_processes = [server]
  server.wait_ready()
  return server


def docker_pipeline(server):
  # save_main_session: the harness must find the staged main session.
  options = PipelineOptions(
    server.portable_args('--environment_type=DOCKER', '--save_main_session')
  )
  p = beam.Pipeline(options=options)
  total = p | beam.Create(range(100)) | beam.Map(lambda x: x * 2) | beam.CombineGlobally(sum)
  assert_that(total, equal_to([9900]))
  return p


def test_beams_python_image_runs_as_a_local_harness(request, refract_bin, tmp_path):
  server = serve(request, refract_bin, tmp_path, '--sdk_python', sys.executable)
  try:
    result = docker_pipeline(server).run()
    result.wait_until_finish()
    assert result.state == 'DONE'
    assert 'starting the SDK image\'s harness as a process' in server.log_tail(1 << 20)
  finally:
    server.stop()


def test_without_a_matching_interpreter_the_job_fails_saying_so(request, refract_bin, tmp_path):
  server = serve(request, refract_bin, tmp_path, '--sdk_python', str(tmp_path / 'no-such-python'))
  try:
    with pytest.raises(Exception) as failure:
      docker_pipeline(server).run().wait_until_finish()
    text = str(failure.value)
    assert 'SDK image cannot run as a process here' in text, text
    assert 'no-such-python' in text and '--sdk_python' in text, text
  finally:
    server.stop()
