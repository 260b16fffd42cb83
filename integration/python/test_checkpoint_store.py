"""Checkpoints in object storage: `refract serve --checkpoint_store
s3://BUCKET/PREFIX` keeps job records and checkpoints in a real
S3-compatible server (SeaweedFS, built and started here), and a server
killed with SIGKILL and started again on the same bucket resumes the job
from there, with nothing of it in the local state directory.

The pipeline is recovery_pipeline.py (per-key, per-window counts and sums
in user state): its results and counters must be exactly the model's.
"""

import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from refract_testlib import RefractServer, free_port, wait_for_end
from seaweedfs import SeaweedS3
from test_recovery import (
  EVENTS,
  distinct_events,
  expected_results,
  kill_group,
  read_results,
  submit,
  wait_for_results,
)


def object_store_server(refract_bin, s3, state_dir, port, log):
  """A ready Refract server keeping its jobs in `s3`'s bucket."""
  return RefractServer(
    refract_bin,
    log,
    port=port,
    extra_args=[
      '--state_dir',
      state_dir,
      '--checkpoint_store',
      's3://%s/jobs' % s3.bucket,
      '--checkpoint_interval',
      '200ms',
      '--serve_http=false',
    ],
    env={**os.environ, **s3.env()},
  ).wait_ready()


def wait_for_checkpoints(refract_bin, server, job, at_least=2, timeout_s=60):
  """Waits until `refract status JOB` says the job wrote `at_least`
  checkpoints."""
  deadline = time.monotonic() + timeout_s
  while True:
    done = subprocess.run(
      [refract_bin, 'status', job, '--job_endpoint', server.endpoint],
      capture_output=True,
      text=True,
      timeout=30,
    )
    written = re.search(r'checkpoints: (\d+) written', done.stdout)
    if written and int(written.group(1)) >= at_least:
      return
    assert time.monotonic() < deadline, done.stdout + server.log_tail()
    time.sleep(0.2)


@pytest.mark.parametrize('shards', [1, 3], ids=['one_engine', 'shards'])
def test_a_job_resumes_from_checkpoints_in_object_storage(request, refract_bin, tmp_path, shards):
  """The server is killed mid-job and started again: the job resumes from
  the bucket's checkpoint (on three shards, an epoch all of them cut), and
  its results and counters are exact. The state directory holds no
  database: the records and checkpoints are objects in the bucket."""
  s3 = SeaweedS3(tmp_path / 's3').start()
  output = tmp_path / 'out'
  output.mkdir()
  state, port = tmp_path / 'state', free_port()
  servers = []
  request.node.refract_processes = servers
  events = 3 * EVENTS
  experiments = ['refract_shards=%d' % shards] if shards > 1 else []
  try:
    servers.append(object_store_server(refract_bin, s3, state, port, tmp_path / 'refract-1.log'))
    job = submit(servers[-1].endpoint, output, *experiments, events=events)
    wait_for_results(output, servers[-1])
    wait_for_checkpoints(refract_bin, servers[-1], job)
    assert s3.objects('jobs/heads'), 'no write reached the bucket'
    servers[-1].proc.send_signal(signal.SIGKILL)
    servers[-1].proc.wait()
    kill_group(servers[-1])
    assert not (state / 'db').exists(), 'a local database was written'
    servers.append(object_store_server(refract_bin, s3, state, port, tmp_path / 'refract-2.log'))
    assert wait_for_end(servers[-1], job) == 'DONE', servers[-1].log_tail()
    assert 'resuming from the job' in servers[-1].log_tail(100_000)
    assert distinct_events(servers[-1].endpoint, job) == events
  finally:
    for server in servers:
      server.stop()
      kill_group(server)
    s3.stop()
  assert read_results(output) == expected_results(events)


def test_a_job_resumes_on_another_host_with_its_staged_files(request, refract_bin, tmp_path):
  """The server is killed mid-job and its state directory removed, and a
  server with another, empty one (another host's) takes the job over from
  the bucket alone:
  the files staged for the job come from the bucket too, the job ends
  DONE with exact results, and its staged files leave the bucket with
  it."""
  s3 = SeaweedS3(tmp_path / 's3').start()
  output = tmp_path / 'out'
  output.mkdir()
  port = free_port()
  servers = []
  request.node.refract_processes = servers
  events = 3 * EVENTS
  try:
    servers.append(
      object_store_server(refract_bin, s3, tmp_path / 'host-a', port, tmp_path / 'refract-a.log')
    )
    job = submit(servers[-1].endpoint, output, events=events)
    wait_for_results(output, servers[-1])
    wait_for_checkpoints(refract_bin, servers[-1], job)
    staged = s3.objects('jobs/staged/%s' % job)
    assert staged, 'no staged file reached the bucket'
    servers[-1].proc.send_signal(signal.SIGKILL)
    servers[-1].proc.wait()
    kill_group(servers[-1])
    # The host is gone, and its disk with it.
    shutil.rmtree(tmp_path / 'host-a')
    servers.append(
      object_store_server(refract_bin, s3, tmp_path / 'host-b', port, tmp_path / 'refract-b.log')
    )
    assert wait_for_end(servers[-1], job) == 'DONE', servers[-1].log_tail()
    log = servers[-1].log_tail(100_000)
    assert 'fetched a staged file from the checkpoint store' in log, log
    assert distinct_events(servers[-1].endpoint, job) == events
    # Deleted with the job, here and in the bucket, once it is forgotten.
    deadline = time.monotonic() + 30
    while s3.objects('jobs/staged/%s' % job) and time.monotonic() < deadline:
      time.sleep(0.5)
    assert not s3.objects('jobs/staged/%s' % job)
    assert not (tmp_path / 'host-b' / 'staged' / job).exists()
  finally:
    for server in servers:
      server.stop()
      kill_group(server)
    s3.stop()
  assert read_results(output) == expected_results(events)


def test_a_bad_checkpoint_store_stops_the_server_with_the_reason(refract_bin, tmp_path):
  """A URL that is not s3:// and one without --state_dir end the server at
  once, saying what is wrong."""
  for extra, said in [
    (['--state_dir', str(tmp_path / 'state'), '--checkpoint_store', 'gs://b/p'], 's3://BUCKET'),
    (['--checkpoint_store', 's3://b/p'], '--state_dir'),
  ]:
    server = RefractServer(refract_bin, tmp_path / 'bad.log', extra_args=extra)
    assert server.proc.wait(timeout=60) != 0
    server.stop()
    assert said in server.log_tail(), server.log_tail()
