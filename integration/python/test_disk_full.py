"""Full disks, on small tmpfs mounts the tests make (as root) and remove:

- staging past the disk, or past --max_staged_bytes, fails that job with a
  message saying why, and the server takes the next job;
- a spill directory that fills up fails a batch job clearly;
- a state directory that fills up under a running durable job makes its
  checkpoints fail loudly (job messages, `refract status`) while it runs
  on; killed then, and started again once there is room, it resumes from
  its last good checkpoint and writes exactly the results of a straight
  run: nothing committed was lost.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from refract_testlib import RefractServer
from refract_testlib import durable_server
from refract_testlib import free_port
from refract_testlib import job_state
from refract_testlib import wait_for_end

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason='mounting a small tmpfs needs root')


@contextlib.contextmanager
def small_disk(path, size):
  """A tmpfs of `size` (e.g. '4m') mounted at `path` while in use."""
  path.mkdir(parents=True, exist_ok=True)
  subprocess.run(
    ['mount', '-t', 'tmpfs', '-o', 'size=%s,mode=0700' % size, 'tmpfs', str(path)], check=True
  )
  try:
    yield path
  finally:
    subprocess.run(['umount', '-l', str(path)], check=False)


def fill(path):
  """Fills the filesystem of `path` with a ballast file; returns it."""
  ballast = path / 'ballast'
  subprocess.run(
    ['dd', 'if=/dev/zero', 'of=%s' % ballast, 'bs=64k'], capture_output=True, check=False
  )
  return ballast


def run_with_extra_package(server, package):
  """Runs a tiny pipeline that stages `package`; its final state and the
  client's error text."""
  options = PipelineOptions(server.portable_args('--extra_package=%s' % package))
  p = beam.Pipeline(options=options)
  _ = p | beam.Create([1, 2]) | beam.Map(lambda x: x)
  try:
    result = p.run()
    result.wait_until_finish()
    return result.state, ''
  except Exception as e:  # pylint: disable=broad-except
    return 'FAILED', str(e)


def tiny_job_is_done(server):
  p = beam.Pipeline(options=PipelineOptions(server.portable_args()))
  _ = p | beam.Create(['a']) | beam.Map(lambda x: x)
  result = p.run()
  result.wait_until_finish()
  return result.state == 'DONE'


def test_staging_past_the_disk_or_the_limit_fails_that_job_only(request, refract_bin, tmp_path):
  package = tmp_path / 'ballast-0.1.tar.gz'
  package.write_bytes(os.urandom(6 << 20))
  with small_disk(tmp_path / 'staging', '4m') as staging:
    server = RefractServer(
      refract_bin,
      tmp_path / 'refract.log',
      extra_args=['--staging_dir', str(staging), '--serve_http=false'],
    )
    request.node.refract_processes = [server]
    try:
      server.wait_ready()
      state, error = run_with_extra_package(server, package)
      assert state == 'FAILED', state
      assert 'No space left on device' in error + server.log_tail(1 << 20)
      assert tiny_job_is_done(server), server.log_tail()
    finally:
      server.stop()
  server = RefractServer(
    refract_bin,
    tmp_path / 'refract-limit.log',
    extra_args=['--max_staged_bytes', '1m', '--serve_http=false'],
  )
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    state, error = run_with_extra_package(server, package)
    assert state == 'FAILED', state
    said = error + server.log_tail(1 << 20)
    assert 'would pass the 1048576 bytes a job may stage' in said, said[-3000:]
    assert tiny_job_is_done(server), server.log_tail()
  finally:
    server.stop()


def test_a_full_spill_directory_fails_a_batch_job_clearly(request, refract_bin, tmp_path):
  with small_disk(tmp_path / 'spill', '8m') as spill:
    server = RefractServer(
      refract_bin,
      tmp_path / 'refract.log',
      extra_args=['--memory_budget', '16m', '--spill_dir', str(spill), '--serve_http=false'],
    )
    request.node.refract_processes = [server]
    try:
      server.wait_ready()
      run = subprocess.run(
        [
          sys.executable,
          os.path.join(HERE, 'gbk_spill_pipeline.py'),
          server.endpoint,
          '96',
          '64',
          '100',
        ],
        capture_output=True,
        text=True,
        timeout=600,
      )
      assert run.returncode != 0, run.stdout
      said = run.stdout + run.stderr + server.log_tail(1 << 20)
      assert 'No space left on device' in said, said[-3000:]
      assert tiny_job_is_done(server), server.log_tail()
    finally:
      server.stop()


def test_a_full_state_directory_fails_checkpoints_loudly_and_loses_nothing(
  request, refract_bin, tmp_path
):
  sys.path.insert(0, HERE)
  import test_recovery as recovery  # the pipeline's model and helpers

  output = tmp_path / 'out'
  output.mkdir()
  port = free_port()
  events = 3 * recovery.EVENTS
  with small_disk(tmp_path / 'state', '64m') as state_dir:
    servers = [durable_server(refract_bin, state_dir, port, tmp_path / 'refract-0.log')]
    request.node.refract_processes = servers
    ballast = None
    try:
      job = recovery.submit(servers[-1].endpoint, output, events=events)
      recovery.wait_for_results(output, servers[-1])
      ballast = fill(state_dir)
      deadline = time.monotonic() + 60
      status = ''
      while time.monotonic() < deadline:
        status = subprocess.run(
          [refract_bin, 'status', job, '--job_endpoint', servers[-1].endpoint],
          capture_output=True,
          text=True,
          timeout=30,
        ).stdout
        if 'last failure' in status:
          break
        time.sleep(0.5)
      assert 'last failure' in status, status + servers[-1].log_tail()
      assert job_state(servers[-1].endpoint, job) == 'RUNNING'
      logs = subprocess.run(
        [refract_bin, 'logs', job, '--job_endpoint', servers[-1].endpoint],
        capture_output=True,
        text=True,
        timeout=30,
      ).stdout
      assert 'a checkpoint could not be written' in logs, logs[-3000:]
      # A crash while the disk is full; the disk gets room; a restart.
      servers[-1].proc.send_signal(signal.SIGKILL)
      servers[-1].proc.wait()
      recovery.kill_group(servers[-1])
      ballast.unlink()
      ballast = None
      servers.append(durable_server(refract_bin, state_dir, port, tmp_path / 'refract-1.log'))
      assert wait_for_end(servers[-1], job) == 'DONE', servers[-1].log_tail()
      assert recovery.distinct_events(servers[-1].endpoint, job) == events
    finally:
      if ballast is not None:
        ballast.unlink()
      for s in servers:
        s.stop()
        recovery.kill_group(s)
  assert recovery.read_results(output) == recovery.expected_results(events)
