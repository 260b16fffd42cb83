"""Fault injection: a streaming job survives its runner being killed.

The pipeline (recovery_pipeline.py) reads an unbounded, self-checkpointing
source of numbered events into fixed windows and keeps per-key, per-window
counts and sums in user state, writing one result file per window and key.
It runs once straight through, and once with the runner killed (SIGKILL) at
random moments and started again on the same --state_dir; both must write
exactly the results the model predicts: no number lost, none counted twice.
The same again with an SDK harness process killed instead of the runner,
and with the job stopped with a savepoint (`refract savepoint --stop`) and
the pipeline started again from it.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import grpc
import pytest

from refract_testlib import (
  committed_counter,
  durable_server,
  free_port,
  job_state,
  refract_cli,
  ui_server,
  wait_for_end,
)

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINE = os.path.join(HERE, 'recovery_pipeline.py')
BOOT = os.path.join(os.path.dirname(HERE), 'python_boot.sh')
EVENTS = 400
MS_PER_EVENT = 100


def expected_results(events):
  """(window start s, key) -> {count, total}, from the model."""
  results = {}
  for i in range(events):
    key = (int(i * MS_PER_EVENT / 1000), i % 3)
    r = results.setdefault(key, {'count': 0, 'total': 0})
    r['count'] += 1
    r['total'] += i
  return results


def read_results(output):
  results = {}
  for name in os.listdir(output):
    if not name.endswith('.json') or name.startswith('all-'):
      continue
    start, key = name[: -len('.json')].split('-')
    with open(os.path.join(output, name)) as f:
      results[(int(start), int(key))] = json.load(f)
  return results


def expected_kept(events):
  """key -> what KeepAll reports: every number of the key, once."""
  kept = {}
  for i in range(events):
    k = kept.setdefault(i % 3, {'count': 0, 'total': 0, 'distinct': 0})
    k['count'] += 1
    k['distinct'] += 1
    k['total'] += i
  return kept


def read_kept(output):
  kept = {}
  for name in os.listdir(output):
    if name.startswith('all-') and name.endswith('.json'):
      with open(os.path.join(output, name)) as f:
        kept[int(name[len('all-') : -len('.json')])] = json.load(f)
  return kept


def submit(endpoint, output, *experiments, **pipeline):
  """Submits the pipeline (see `pipeline_command`) and returns its job id."""
  done = run_pipeline(endpoint, output, *experiments, **pipeline)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout.strip().splitlines()[-1]


def run_pipeline(
  endpoint,
  output,
  *experiments,
  events=EVENTS,
  keep_all_kb=0,
  changed=False,
  stateful_name=None,
  mapping=None,
  job_name=None,
  update=False,
  string_keys=False,
  pause=None,
  host=None,
):
  """Runs recovery_pipeline.py to its submission (on virtual host `host`,
  if given): the finished process."""
  run = subprocess.run if host is None else host.run
  return run(
    [
      sys.executable,
      PIPELINE,
      '--job_endpoint',
      endpoint,
      '--output',
      str(output),
      '--events',
      str(events),
      '--boot',
      BOOT,
      '--keep_all_kb',
      str(keep_all_kb),
    ]
    + ['--experiments=' + e for e in experiments]
    + (['--changed'] if changed else [])
    + (['--stateful_name', stateful_name] if stateful_name else [])
    + (['--transform_name_mapping', json.dumps(mapping)] if mapping else [])
    + (['--job_name', job_name] if job_name else [])
    + (['--update'] if update else [])
    + (['--string_keys'] if string_keys else [])
    + (['--pause', str(pause)] if pause else []),
    capture_output=True,
    text=True,
    timeout=120,
  )


def distinct_events(endpoint, job_id, step=None):
  """The job's committed `recovery/distinct_events` counter (of transform
  `step` only, if given)."""
  return committed_counter(endpoint, job_id, 'distinct_events', step)


def wait_for_results(output, server, timeout_s=60):
  """Waits until the job wrote its first result: it is under way, its
  workers are up and its windows are closing."""
  deadline = time.monotonic() + timeout_s
  while not any(n.endswith('.json') for n in os.listdir(output)):
    assert time.monotonic() < deadline, server.log_tail()
    time.sleep(0.1)


def kill_group(server):
  """Ends what is left of a server's process group (its workers)."""
  try:
    os.killpg(server.proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def kill_and_restart(servers, refract_bin, state_dir, port, log, interval='200ms', extra=()):
  """SIGKILLs the latest server and its workers, and starts another on the
  same state directory and port."""
  servers[-1].proc.send_signal(signal.SIGKILL)
  servers[-1].proc.wait()
  kill_group(servers[-1])
  servers.append(durable_server(refract_bin, state_dir, port, log, interval, extra))


def submitted_job(request, refract_bin, tmp_path):
  """A durable server on a fresh state directory, running the pipeline:
  (server, job id, output directory)."""
  output = tmp_path / 'out'
  output.mkdir()
  server = durable_server(refract_bin, tmp_path / 'state', free_port(), tmp_path / 'refract.log')
  request.node.refract_processes = [server]
  try:
    return server, submit(server.endpoint, output), output
  except BaseException:
    server.stop()
    raise


def test_straight_run_matches_the_model(request, refract_bin, tmp_path):
  server, job, output = submitted_job(request, refract_bin, tmp_path)
  try:
    assert wait_for_end(server, job) == 'DONE', server.log_tail()
    assert distinct_events(server.endpoint, job) == EVENTS
  finally:
    server.stop()
  assert read_results(output) == expected_results(EVENTS)


# '0s': a checkpoint after every commit (group commit). 'state_on_disk': a
# bag per key that grows through the job to 1200 x 16 KiB, past the 4 MiB
# share a 4m budget gives its stage, so it goes to disk beside the
# checkpoints, which name it there; it must come back whole after each kill.
# 'shards': the job on three engine shards, each checkpoint an epoch all
# three cut, each kill resuming every shard from the same epoch ('shards_0s':
# an epoch after every commit; 'shards_grpc': the shards exchanging over
# gRPC).
@pytest.mark.parametrize(
  'interval,keep_all_kb,extra,experiments',
  [
    ('200ms', 0, [], []),
    ('0s', 0, [], []),
    ('200ms', 16, ['--memory_budget', '4m'], []),
    ('200ms', 0, [], ['refract_shards=3']),
    ('0s', 0, [], ['refract_shards=3']),
    ('200ms', 0, [], ['refract_shards=3', 'refract_shard_exchange=grpc']),
  ],
  ids=['200ms', '0s', 'state_on_disk', 'shards', 'shards_0s', 'shards_grpc'],
)
def test_runner_killed_and_restarted_gives_the_same_results(
  request, refract_bin, tmp_path, interval, keep_all_kb, extra, experiments
):
  output = tmp_path / 'out'
  output.mkdir()
  state_dir = tmp_path / 'state'
  port = free_port()
  rng = random.Random(os.environ.get('REFRACT_RECOVERY_SEED', '7'))
  # Long enough for several kills and restarts before the end.
  events = 3 * EVENTS
  servers = [
    durable_server(refract_bin, state_dir, port, tmp_path / 'refract-0.log', interval, extra)
  ]
  request.node.refract_processes = servers
  try:
    job = submit(servers[-1].endpoint, output, *experiments, events=events, keep_all_kb=keep_all_kb)
    wait_for_results(output, servers[-1])
    kills = 0
    for attempt in range(3):
      time.sleep(rng.uniform(0.3, 1.5))
      state = job_state(servers[-1].endpoint, job)
      if state != 'RUNNING':
        assert state == 'DONE', servers[-1].log_tail()
        break
      kill_and_restart(
        servers,
        refract_bin,
        state_dir,
        port,
        tmp_path / ('refract-%d.log' % (attempt + 1)),
        interval,
        extra,
      )
      kills += 1
    assert kills > 0, 'the job ended before the first kill'
    state = wait_for_end(servers[-1], job)
    assert state == 'DONE', servers[-1].log_tail()
    assert 'resuming from the job' in servers[-1].log_tail(200000)
    # Metrics are checkpointed with the state: none lost, none twice.
    assert distinct_events(servers[-1].endpoint, job) == events
    last_log = servers[-1].log_tail(1 << 20)
  finally:
    for s in servers:
      s.stop()
      kill_group(s)
  assert read_results(output) == expected_results(events)
  if keep_all_kb:
    assert read_kept(output) == expected_kept(events)
    # The last server, too, moved bags to disk past the stage's share.
    finished = [line for line in last_log.splitlines() if 'engine finished' in line]
    spilled = re.search(r'\bstate_spilled_bytes=(\d+)', finished[-1] if finished else '')
    assert spilled and int(spilled.group(1)) > 0, finished


def test_harness_killed_gives_the_same_results(request, refract_bin, tmp_path):
  server, job, output = submitted_job(request, refract_bin, tmp_path)
  try:
    killed = 0
    deadline = time.monotonic() + 60
    while not killed and time.monotonic() < deadline:
      time.sleep(0.3)
      # Mid-job: the worker is connected and results are coming out.
      if not any(n.endswith('.json') for n in os.listdir(output)):
        continue
      workers = subprocess.run(
        ['pgrep', '-f', '-s', str(server.proc.pid), 'sdk_worker_main'],
        capture_output=True,
        text=True,
      ).stdout.split()
      for pid in workers[:1]:
        os.kill(int(pid), signal.SIGKILL)
        killed += 1
    assert killed, 'no SDK worker process to kill'
    assert wait_for_end(server, job) == 'DONE', server.log_tail()
    assert distinct_events(server.endpoint, job) == EVENTS
  finally:
    server.stop()
  assert read_results(output) == expected_results(EVENTS)


def stop_with_savepoint(refract_bin, job, savepoint, ui):
  """Runs `refract savepoint JOB --path NAME --stop` against the UI at
  `ui`, which writes `savepoint` in the server's savepoint directory;
  checks that it succeeded and returns the finished process."""
  done = subprocess.run(
    [
      refract_bin,
      'savepoint',
      job,
      '--path',
      savepoint.name,
      '--stop',
      '--ui_endpoint',
      ui[len('http://') :],
    ],
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert done.returncode == 0, done.stderr + done.stdout
  return done


@pytest.mark.parametrize('changed', [False, True], ids=['same', 'changed'])
def test_stop_with_savepoint_and_start_again_gives_the_same_results(
  request, refract_bin, tmp_path, changed
):
  """The job is stopped with a savepoint and started from it: the same
  pipeline, or its next version (a step added, transforms renumbered, the
  sink fused apart, the stateful DoFn renamed with
  --transform_name_mapping), which finds the old job's state, timers,
  waiting elements and counters by the transforms' names."""
  output = tmp_path / 'out'
  output.mkdir()
  savepoints = tmp_path / 'savepoints'
  server, ui = ui_server(
    refract_bin, tmp_path / 'refract.log', extra_args=['--savepoint_dir', str(savepoints)]
  )
  server.wait_ready()
  request.node.refract_processes = [server]
  savepoint = savepoints / 'job.savepoint'
  # Long enough that the savepoint lands well before the end.
  events = 3 * EVENTS
  try:
    job = submit(server.endpoint, output, events=events)
    wait_for_results(output, server)
    # A file name: the server writes it in its savepoint directory.
    done = stop_with_savepoint(refract_bin, job, savepoint, ui)
    assert 'written to %s' % savepoint in done.stdout, done.stdout
    assert wait_for_end(server, job) == 'CANCELLED'
    assert read_results(output) != expected_results(events), (
      'the job ended before its savepoint; nothing left to resume'
    )
    resume = 'refract_savepoint=%s' % savepoint
    if changed:
      # The stateful DoFn under another name: its waiting elements and
      # state have no owner, and the start is refused with the reason.
      renamed = submit(
        server.endpoint, output, resume, events=events, changed=True, stateful_name='Counted'
      )
      assert wait_for_end(server, renamed) == 'FAILED'
      assert "'DedupCount', which the pipeline does not have" in server.log_tail(100000)
    # The next version renames the stateful DoFn, and says so.
    stateful = 'Counted' if changed else 'DedupCount'
    again = submit(
      server.endpoint,
      output,
      resume,
      events=events,
      changed=changed,
      stateful_name=stateful,
      mapping={'DedupCount': 'Counted'} if changed else None,
    )
    assert wait_for_end(server, again) == 'DONE', server.log_tail()
    # The savepoint carried the job's counters on, under the transform's
    # name in this pipeline.
    assert distinct_events(server.endpoint, again, step=stateful) == events
    # A bad savepoint fails the job at its start, with the reason.
    savepoint.write_bytes(b'not a savepoint')
    bad = submit(server.endpoint, output, 'refract_savepoint=%s' % savepoint, events=events)
    assert wait_for_end(server, bad) == 'FAILED'
    assert 'not a Refract savepoint' in server.log_tail(100000)
  finally:
    server.stop()
    kill_group(server)
  assert read_results(output) == expected_results(events)


def test_a_job_on_shards_rescales_through_a_savepoint(request, refract_bin, tmp_path):
  """A stateful streaming job on two engine shards is stopped with a
  savepoint (an epoch every shard cuts, after which all of them stop) and
  started from it on three shards: each key's state, timers and waiting
  elements move to the shard that now owns its key group, and the counters
  go on. Results and counters are exact."""
  output = tmp_path / 'out'
  output.mkdir()
  savepoints = tmp_path / 'savepoints'
  server, ui = ui_server(
    refract_bin,
    tmp_path / 'refract.log',
    extra_args=[
      '--savepoint_dir',
      str(savepoints),
      '--state_dir',
      str(tmp_path / 'state'),
      '--checkpoint_interval',
      '200ms',
    ],
  )
  server.wait_ready()
  request.node.refract_processes = [server]
  savepoint = savepoints / 'sharded.savepoint'
  events = 3 * EVENTS
  try:
    job = submit(server.endpoint, output, 'refract_shards=2', events=events)
    wait_for_results(output, server)
    stop_with_savepoint(refract_bin, job, savepoint, ui)
    assert wait_for_end(server, job) == 'CANCELLED'
    assert read_results(output) != expected_results(events), (
      'the job ended before its savepoint; nothing left to resume'
    )
    resume = 'refract_savepoint=%s' % savepoint
    again = submit(server.endpoint, output, 'refract_shards=3', resume, events=events)
    assert wait_for_end(server, again) == 'DONE', server.log_tail()
    assert distinct_events(server.endpoint, again) == events
  finally:
    server.stop()
    kill_group(server)
  assert read_results(output) == expected_results(events)


# The source's pause between steps in the update tests: slow enough that a
# job outlasts the several clients (a few seconds each, more on a loaded
# machine) that try to update it while it runs.
UPDATE_PAUSE = 0.12


def submit_update(endpoint, output, events, *experiments):
  """Submits the pipeline's next version as an update of the job named
  `counts`, its stateful DoFn renamed with a mapping: the new job's id."""
  return submit(
    endpoint,
    output,
    *experiments,
    events=events,
    changed=True,
    stateful_name='Counted',
    mapping={'DedupCount': 'Counted'},
    job_name='counts',
    update=True,
    pause=UPDATE_PAUSE,
  )


def test_update_replaces_the_running_job_carrying_its_state(request, refract_bin, tmp_path):
  """Dataflow's `--update`: the next version of the pipeline (a step added,
  transforms renumbered, the sink fused apart, the stateful DoFn renamed
  with --transform_name_mapping) replaces the running job of its
  --job_name. An update that could lose state, or read it in another key
  coder, is refused at submission, naming the transform, and the running
  job runs on; the accepted one
  stops it (UPDATED) and goes on from its state: every number counted
  once."""
  output = tmp_path / 'out'
  output.mkdir()
  server, _ = ui_server(refract_bin, tmp_path / 'refract.log')
  server.wait_ready()
  request.node.refract_processes = [server]
  events = 3 * EVENTS
  try:
    old = submit(server.endpoint, output, events=events, job_name='counts', pause=UPDATE_PAUSE)
    wait_for_results(output, server)
    nameless = run_pipeline(server.endpoint, output, events=events, job_name='other', update=True)
    assert nameless.returncode != 0
    assert 'no running job has --job_name=other' in nameless.stderr
    unmapped = run_pipeline(
      server.endpoint,
      output,
      events=events,
      changed=True,
      stateful_name='Counted',
      job_name='counts',
      update=True,
    )
    assert unmapped.returncode != 0
    assert 'refused, and it runs on' in unmapped.stderr, unmapped.stderr[-3000:]
    assert "'DedupCount'" in unmapped.stderr
    rekeyed = run_pipeline(
      server.endpoint, output, events=events, job_name='counts', update=True, string_keys=True
    )
    assert rekeyed.returncode != 0
    assert "'DedupCount': its key coder changed" in rekeyed.stderr, rekeyed.stderr[-3000:]
    assert job_state(server.endpoint, old) == 'RUNNING'
    new = submit_update(server.endpoint, output, events)
    assert wait_for_end(server, old) == 'UPDATED', server.log_tail()
    assert read_results(output) != expected_results(events), (
      'the old job ended before the update; nothing was carried'
    )
    assert wait_for_end(server, new) == 'DONE', server.log_tail()
    assert distinct_events(server.endpoint, new, step='Counted') == events
    # `refract jobs` links the two.
    listed = refract_cli(refract_bin, server, 'jobs').stdout
    assert '%s\tUPDATED\tjob\treplaced by %s' % (old, new) in listed, listed
    assert '%s\tDONE\tjob\treplaces %s' % (new, old) in listed, listed
  finally:
    server.stop()
    kill_group(server)
  assert read_results(output) == expected_results(events)


def test_an_update_on_a_durable_server_survives_a_kill_after_it(request, refract_bin, tmp_path):
  """With --state_dir the new job checkpoints as soon as it took over: a
  server killed (SIGKILL) right after the update resumes the new job from
  there, in its own names, and every number is still counted once."""
  output = tmp_path / 'out'
  output.mkdir()
  state_dir = tmp_path / 'state'
  port = free_port()
  events = 3 * EVENTS
  # Periodic checkpoints an hour apart: only the one taken on taking over
  # can be there to resume from.
  servers = [durable_server(refract_bin, state_dir, port, tmp_path / 'refract-0.log', '1h')]
  request.node.refract_processes = servers
  try:
    old = submit(servers[-1].endpoint, output, events=events, job_name='counts', pause=UPDATE_PAUSE)
    wait_for_results(output, servers[-1])
    new = submit_update(servers[-1].endpoint, output, events)
    assert wait_for_end(servers[-1], old) == 'UPDATED', servers[-1].log_tail()
    time.sleep(1)
    assert job_state(servers[-1].endpoint, new) == 'RUNNING'
    kill_and_restart(servers, refract_bin, state_dir, port, tmp_path / 'refract-1.log', '1h')
    assert wait_for_end(servers[-1], new) == 'DONE', servers[-1].log_tail()
    assert 'resuming from the job' in servers[-1].log_tail(200000)
    assert distinct_events(servers[-1].endpoint, new, step='Counted') == events
  finally:
    for s in servers:
      s.stop()
      kill_group(s)
  assert read_results(output) == expected_results(events)


def test_a_job_on_shards_is_updated_and_rescaled(request, refract_bin, tmp_path):
  """`--update` of a checkpointed job on two shards: the next version of
  the pipeline (a step added, the stateful DoFn renamed with a mapping)
  on the same shards, then the same pipeline on three shards; each takes
  over an epoch of the job it replaces. Changing the pipeline and the
  number of shards at once is refused while the job runs on."""
  output = tmp_path / 'out'
  output.mkdir()
  server = durable_server(refract_bin, tmp_path / 'state', free_port(), tmp_path / 'refract.log')
  request.node.refract_processes = [server]
  events = 4 * EVENTS
  two = 'refract_shards=2'
  try:
    first = submit(
      server.endpoint, output, two, events=events, job_name='counts', pause=UPDATE_PAUSE
    )
    wait_for_results(output, server)
    both = run_pipeline(
      server.endpoint,
      output,
      'refract_shards=3',
      events=events,
      changed=True,
      job_name='counts',
      update=True,
    )
    assert both.returncode != 0
    assert 'same pipeline, fused the same way' in both.stderr, both.stderr[-3000:]
    assert job_state(server.endpoint, first) == 'RUNNING'
    second = submit_update(server.endpoint, output, events, two)
    assert wait_for_end(server, first) == 'UPDATED', server.log_tail()
    third = submit(
      server.endpoint,
      output,
      'refract_shards=3',
      events=events,
      changed=True,
      stateful_name='Counted',
      job_name='counts',
      update=True,
      pause=UPDATE_PAUSE,
    )
    assert wait_for_end(server, second) == 'UPDATED', server.log_tail()
    assert wait_for_end(server, third) == 'DONE', server.log_tail()
    assert distinct_events(server.endpoint, third, step='Counted') == events
  finally:
    server.stop()
    kill_group(server)
  assert read_results(output) == expected_results(events)


def test_a_job_that_asks_for_memory_state_is_not_resumed(request, refract_bin, tmp_path):
  output = tmp_path / 'out'
  output.mkdir()
  state_dir = tmp_path / 'state'
  port = free_port()
  servers = [durable_server(refract_bin, state_dir, port, tmp_path / 'refract-0.log')]
  request.node.refract_processes = servers
  try:
    job = submit(servers[-1].endpoint, output, 'refract_state_store=memory', events=3 * EVENTS)
    wait_for_results(output, servers[-1])
    kill_and_restart(servers, refract_bin, state_dir, port, tmp_path / 'refract-1.log', '1h')
    try:
      state = job_state(servers[-1].endpoint, job)
    except grpc.RpcError as e:
      assert e.code() == grpc.StatusCode.NOT_FOUND, e
    else:
      raise AssertionError('the in-memory job came back as %s' % state)
  finally:
    for s in servers:
      s.stop()
      kill_group(s)
