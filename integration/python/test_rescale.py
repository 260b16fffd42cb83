"""`refract rescale JOB --shards M`: a running job moves onto another
number of engine shards under its id, its keyed state moving by key group.

The pipeline is recovery_pipeline.py (per-key, per-window counts and sums
in user state, one result file per window and key); after every move the
job goes on, stays RUNNING under the same id, and ends DONE with exactly
the results the model predicts and every event counted once.
"""

import os
import subprocess
import time

from refract_testlib import (
  RefractServer,
  durable_server,
  free_port,
  job_messages,
  job_state,
  wait_for_end,
)
from test_recovery import (
  EVENTS,
  distinct_events,
  expected_results,
  kill_and_restart,
  kill_group,
  read_results,
  submit,
  wait_for_results,
)


def rescale(refract_bin, endpoint, job, shards):
  """Runs `refract rescale JOB --shards N`: the finished process."""
  return subprocess.run(
    [refract_bin, 'rescale', job, '--shards', str(shards), '--job_endpoint', endpoint],
    capture_output=True,
    text=True,
    timeout=120,
  )


def moved(refract_bin, endpoint, job, shards, server):
  """Moves `job` onto `shards` shards, checking that it said so and runs on
  under its id."""
  done = rescale(refract_bin, endpoint, job, shards)
  assert done.returncode == 0, done.stderr + server.log_tail()
  assert 'to %d shards' % shards in done.stdout, done.stdout
  assert job_state(endpoint, job) == 'RUNNING'
  now = 'one engine' if shards == 1 else '%d shards' % shards
  said = 'runs on %s from its savepoint' % now
  assert any(said in m for m in job_messages(endpoint, job)), said


def status(refract_bin, endpoint, job):
  """What `refract status JOB` prints."""
  done = subprocess.run(
    [refract_bin, 'status', job, '--job_endpoint', endpoint],
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert done.returncode == 0, done.stderr
  return done.stdout


def more_results(output, server, timeout_s=60):
  """Waits until the job wrote a result file it had not written yet: it
  makes progress."""
  before = len(os.listdir(output))
  deadline = time.monotonic() + timeout_s
  while len(os.listdir(output)) <= before:
    assert time.monotonic() < deadline, server.log_tail()
    time.sleep(0.1)


def test_a_durable_job_moves_between_shards_under_its_id(request, refract_bin, tmp_path):
  """On a server with --state_dir: 2 -> 3 shards, then onto one engine,
  through a kill -9 of the server (the job resumes on one engine, as its
  record says), then onto 2 shards again. Results and counters are exact."""
  output = tmp_path / 'out'
  output.mkdir()
  state, port, log = tmp_path / 'state', free_port(), tmp_path / 'refract.log'
  servers = [durable_server(refract_bin, state, port, log)]
  request.node.refract_processes = servers
  events = 4 * EVENTS
  try:
    endpoint = servers[-1].endpoint
    job = submit(endpoint, output, 'refract_shards=2', events=events)
    wait_for_results(output, servers[-1])
    moved(refract_bin, endpoint, job, 3, servers[-1])
    assert 'shards: 3' in status(refract_bin, endpoint, job)
    more_results(output, servers[-1])
    moved(refract_bin, endpoint, job, 1, servers[-1])
    assert 'shards:' not in status(refract_bin, endpoint, job)
    more_results(output, servers[-1])
    kill_and_restart(servers, refract_bin, state, port, log)
    more_results(output, servers[-1])
    assert 'shards:' not in status(refract_bin, endpoint, job)
    moved(refract_bin, endpoint, job, 2, servers[-1])
    assert wait_for_end(servers[-1], job) == 'DONE', servers[-1].log_tail()
    assert distinct_events(endpoint, job) == events
  finally:
    for server in servers:
      server.stop()
      kill_group(server)
  assert read_results(output) == expected_results(events)


def test_a_job_moves_from_one_engine_onto_shards_in_memory(request, refract_bin, tmp_path):
  """Without --state_dir a job on one engine moves onto shards (its cut is
  handed over in memory); a job on shards takes no savepoint without
  checkpoints, so moving it again is refused and it runs on. Wrong
  requests fail with a reason and change nothing."""
  output = tmp_path / 'out'
  output.mkdir()
  server = RefractServer(
    refract_bin, tmp_path / 'refract.log', extra_args=['--serve_http=false']
  ).wait_ready()
  request.node.refract_processes = [server]
  events = 3 * EVENTS
  try:
    job = submit(server.endpoint, output, events=events)
    wait_for_results(output, server)
    zero = rescale(refract_bin, server.endpoint, job, 0)
    assert zero.returncode != 0 and '--shards' in zero.stderr, zero.stderr
    same = rescale(refract_bin, server.endpoint, job, 1)
    assert same.returncode != 0 and 'already' in same.stderr, same.stderr
    unknown = rescale(refract_bin, server.endpoint, 'no-such-job', 2)
    assert unknown.returncode != 0 and 'no-such-job' in unknown.stderr, unknown.stderr
    moved(refract_bin, server.endpoint, job, 2, server)
    more_results(output, server)
    again = rescale(refract_bin, server.endpoint, job, 3)
    assert again.returncode != 0 and '--state_dir' in again.stderr, again.stderr
    assert job_state(server.endpoint, job) == 'RUNNING'
    assert wait_for_end(server, job) == 'DONE', server.log_tail()
    assert distinct_events(server.endpoint, job) == events
  finally:
    server.stop()
    kill_group(server)
  assert read_results(output) == expected_results(events)
