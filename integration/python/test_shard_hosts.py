"""A job's engine shards in other processes: a coordinator (`refract serve
--shard_listen`) and three shard hosts (`refract shard --coordinator`),
each with its own Fn API, SDK workers, engines and exchange server. The
coordinator runs no worker and no engine of the job; the hosts' shards
exchange elements and watermarks with each other directly. Every pipeline
checks its own output with `assert_that`, so a lost, duplicated or
early-fired element fails it.
"""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from refract_testlib import (
  RefractProcess,
  RefractServer,
  committed_counter,
  free_port,
  job_messages,
  spilled_bytes,
  submit_java,
  wait_for_end,
)
import test_recovery as recovery
import test_rescale as rescaling
from test_shards import WORDS, count_and_weigh_words, count_sessions, sum_at_window_ends

HOSTS = 3
HERE = os.path.dirname(os.path.abspath(__file__))


class ShardCluster:
  """A coordinator and its shard hosts, each a process of its own."""

  def __init__(self, refract_bin, tmp_path, extra_args=()):
    self.binary = refract_bin
    self.tmp = tmp_path
    self.secret = tmp_path / 'cluster-secret'
    self.secret.write_text(os.urandom(24).hex() + '\n')
    os.chmod(self.secret, 0o600)
    self.shard_port = free_port()
    self.coordinator_args = [
      '--shard_listen',
      '127.0.0.1:%d' % self.shard_port,
      '--shard_secret_file',
      self.secret,
      '--serve_http=false',
    ] + list(extra_args)
    self.coordinator = RefractServer(
      refract_bin, tmp_path / 'coordinator.log', extra_args=self.coordinator_args
    )
    self.hosts = []

  def restart_coordinator(self):
    """Kills the coordinator (SIGKILL) and starts another on the same ports
    and flags, as its orchestrator would."""
    os.killpg(self.coordinator.proc.pid, signal.SIGKILL)
    self.coordinator.proc.wait()
    self.coordinator.stop()
    self.coordinator = RefractServer(
      self.binary,
      self.tmp / 'coordinator-2.log',
      port=self.coordinator.port,
      extra_args=self.coordinator_args,
    ).wait_ready()

  def start_host(self, name, secret=None):
    host = RefractProcess(
      [
        self.binary,
        'shard',
        '--coordinator',
        '127.0.0.1:%d' % self.shard_port,
        '--secret_file',
        secret or self.secret,
        '--name',
        name,
      ],
      self.tmp / ('%s.log' % name),
    )
    self.hosts.append(host)
    return host

  def attached(self):
    return len(re.findall('a shard host attached', self.coordinator.log_tail(10**7)))

  def detached(self):
    return len(re.findall('a shard host detached', self.coordinator.log_tail(10**7)))

  def wait_attached(self, count, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while self.attached() - self.detached() < count:
      if time.monotonic() > deadline:
        raise AssertionError(
          '%d shard hosts did not attach; log:\n%s' % (count, self.coordinator.log_tail())
        )
      time.sleep(0.1)

  def wait_for_log(self, process, text, timeout_s=60):
    """Waits until `text` is in `process`'s log."""
    deadline = time.monotonic() + timeout_s
    while text not in process.log_tail(10**7):
      assert time.monotonic() < deadline, process.log_tail()
      time.sleep(0.1)

  def options(self, *extra):
    return PipelineOptions(self.coordinator.portable_args(*extra))

  def submit_recovery_job(self, output):
    """Submits the streaming recovery pipeline: its job id, once it wrote
    its first result and its first checkpoint (so that a failure from
    here on has one to resume from)."""
    endpoint = self.coordinator.endpoint
    job = recovery.submit(endpoint, output)
    recovery.wait_for_results(output, self.coordinator)
    deadline = time.monotonic() + 60
    while True:
      status = rescaling.status(self.binary, endpoint, job)
      if checkpoints_written(status) > 0:
        return job
      assert time.monotonic() < deadline, status + self.coordinator.log_tail()
      time.sleep(0.2)

  def stop(self):
    for host in self.hosts:
      host.stop()
    self.coordinator.stop()


def checkpoints_written(status):
  """How many checkpoints `refract status` says the job wrote."""
  written = re.search(r'checkpoints: (\d+) written', status)
  return int(written.group(1)) if written else 0


@contextlib.contextmanager
def running_cluster(request, refract_bin, tmp_path, extra_args=(), hosts=HOSTS):
  """A coordinator with `hosts` shard hosts attached."""
  cluster = ShardCluster(refract_bin, tmp_path, extra_args)
  request.node.refract_processes = [cluster.coordinator]
  try:
    cluster.coordinator.wait_ready()
    for n in range(hosts):
      request.node.refract_processes.append(cluster.start_host('host%d' % n))
    cluster.wait_attached(hosts)
    yield cluster
  finally:
    cluster.stop()


@pytest.fixture
def cluster(request, refract_bin, tmp_path):
  with running_cluster(request, refract_bin, tmp_path) as cluster:
    yield cluster


class CountElements(beam.DoFn):
  def __init__(self):
    self.seen = Metrics.counter('hosts', 'seen')

  def process(self, element):
    self.seen.inc()
    yield element


def test_pipelines_on_shard_hosts_match_one_engine(cluster):
  p = beam.Pipeline(options=cluster.options())
  count_and_weigh_words(p, beam.ParDo(CountElements()))
  result = p.run()
  assert result.wait_until_finish() == 'DONE'
  job_id = result._job_id  # pylint: disable=protected-access
  said = job_messages(cluster.coordinator.endpoint, job_id)
  assert any('running on 3 engine shards on 3 shard hosts' in m for m in said), said
  # The hosts' committed metrics add up on the coordinator.
  assert committed_counter(cluster.coordinator.endpoint, job_id, 'seen') == len(WORDS)
  # No SDK worker ran on the coordinator: every worker connected to a host.
  coordinator_log = cluster.coordinator.log_tail(10**7)
  assert 'worker connected' not in coordinator_log
  for host in cluster.hosts:
    assert 'worker connected' in host.log_tail(10**7), host.log_tail()


def test_state_timers_and_sessions_on_shard_hosts(cluster):
  with beam.Pipeline(options=cluster.options()) as p:
    sum_at_window_ends(p)
    count_sessions(p)


def fail_on_seven(n):
  if n == 7:
    raise ValueError('seven is not allowed on a shard host')
  return n


def test_a_failing_dofn_fails_the_job_with_the_sdks_error(cluster):
  p = beam.Pipeline(options=cluster.options())
  _ = (
    p
    | beam.Create(range(20))
    | beam.Map(lambda n: (n % 3, n))
    | beam.GroupByKey()
    | beam.FlatMap(lambda kv: kv[1])
    | beam.Map(fail_on_seven)
  )
  with pytest.raises(Exception, match='seven is not allowed on a shard host'):
    p.run().wait_until_finish()
  # The hosts stay attached, ready for the next job.
  cluster.wait_attached(HOSTS)


def slow_identity(n):
  time.sleep(0.02)
  return n


def slow_grouping(options, count):
  """A pipeline grouping `count` numbers after 20 ms of work on each,
  spread over the shards by a Reshuffle."""
  p = beam.Pipeline(options=options)
  _ = (
    p
    | beam.Create(range(count))
    | beam.Reshuffle()
    | beam.Map(slow_identity)
    | beam.Map(lambda n: (n % 50, n))
    | beam.GroupByKey()
  )
  return p


def test_a_killed_shard_host_fails_its_run_and_the_next_job_runs_on_the_rest(cluster):
  result = slow_grouping(cluster.options(), 3000).run()
  job_id = result._job_id  # pylint: disable=protected-access
  # Kill a host once its shards are working.
  victim = cluster.hosts[1]
  cluster.wait_for_log(victim, 'running shards')
  time.sleep(1.0)
  killed_at = time.monotonic()
  os.killpg(victim.proc.pid, signal.SIGKILL)
  state = wait_for_end(cluster.coordinator, job_id, timeout_s=60)
  ended_after = time.monotonic() - killed_at
  assert state == 'FAILED'
  assert ended_after < 15, ended_after
  said = ' '.join(job_messages(cluster.coordinator.endpoint, job_id))
  assert 'was lost' in said or 'lost its exchange' in said, said
  # The next job is placed on the two hosts left.
  cluster.wait_attached(HOSTS - 1)
  with beam.Pipeline(options=cluster.options()) as p:
    sums = p | beam.Create(range(100)) | beam.Map(lambda n: (n % 4, n)) | beam.CombinePerKey(sum)
    assert_that(sums, equal_to([(k, sum(range(k, 100, 4))) for k in range(4)]))


def test_cancelling_a_job_stops_its_shards_on_every_host(cluster):
  result = slow_grouping(cluster.options('--streaming'), 100000).run()
  job_id = result._job_id  # pylint: disable=protected-access
  for host in cluster.hosts:
    cluster.wait_for_log(host, 'running shards')
  result.cancel()
  assert wait_for_end(cluster.coordinator, job_id, timeout_s=60) == 'CANCELLED'
  for host in cluster.hosts:
    cluster.wait_for_log(host, "a run's part", timeout_s=30)


def test_a_host_without_the_secret_is_refused(cluster, tmp_path):
  wrong = tmp_path / 'wrong-secret'
  wrong.write_text('not-the-cluster-secret-at-all\n')
  stranger = cluster.start_host('stranger', secret=wrong)
  cluster.wait_for_log(stranger, 'cannot attach', timeout_s=30)
  assert 'does not match' in stranger.log_tail(10**7)
  assert cluster.attached() == HOSTS


def test_a_coordinator_that_does_not_know_the_secret_gets_no_host(refract_bin, tmp_path):
  # A stranger listening where hosts look for their coordinator, with a
  # secret of its own: the host refuses to take its work.
  mine = tmp_path / 'mine'
  mine.write_text('the-hosts-own-secret-0123456789\n')
  theirs = tmp_path / 'theirs'
  theirs.write_text('a-strangers-secret-0123456789\n')
  cluster = ShardCluster(refract_bin, tmp_path)
  cluster.coordinator.stop()
  port = cluster.shard_port
  stranger = RefractServer(
    refract_bin,
    tmp_path / 'stranger.log',
    extra_args=['--shard_listen', '127.0.0.1:%d' % port, '--shard_secret_file', theirs],
  )
  try:
    stranger.wait_ready()
    host = cluster.start_host('careful', secret=mine)
    cluster.wait_for_log(host, 'cannot attach', timeout_s=30)
  finally:
    for h in cluster.hosts:
      h.stop()
    stranger.stop()
  assert 'a shard host attached' not in stranger.log_tail(10**7)


def test_bad_shard_flags_exit_with_a_reason(refract_bin, tmp_path):
  secret = tmp_path / 'secret'
  secret.write_text('short\n')
  run = subprocess.run(
    [refract_bin, 'shard', '--coordinator', '127.0.0.1:1', '--secret_file', secret],
    capture_output=True,
    text=True,
    timeout=30,
  )
  assert run.returncode != 0
  assert 'at least 16' in run.stderr, run.stderr
  run = subprocess.run([refract_bin, 'shard'], capture_output=True, text=True, timeout=30)
  assert run.returncode != 0
  assert '--coordinator' in run.stderr, run.stderr


def test_a_killed_host_under_a_checkpointed_job_is_recovered_on_the_rest(
  request, refract_bin, tmp_path
):
  # The streaming recovery pipeline (an unbounded source, windows, user
  # state, a file per window and key) on three hosts, checkpointing in
  # epochs every 200 ms; one host is killed with its workers mid-job. The
  # job goes on from the last complete epoch on the two hosts left, its
  # key groups moved to them, with the model's results and every event
  # counted once.
  state = ['--state_dir', tmp_path / 'state', '--checkpoint_interval', '200ms']
  with running_cluster(request, refract_bin, tmp_path, state) as cluster:
    output = tmp_path / 'out'
    output.mkdir()
    endpoint = cluster.coordinator.endpoint
    job = cluster.submit_recovery_job(output)
    os.killpg(cluster.hosts[1].proc.pid, signal.SIGKILL)
    assert wait_for_end(cluster.coordinator, job, timeout_s=180) == 'DONE'
    assert recovery.distinct_events(endpoint, job) == recovery.EVENTS
    said = ' '.join(job_messages(endpoint, job))
    assert 'was lost' in said or 'lost its exchange' in said, said
    assert 'resumed from checkpoint' in said, said
    assert 'on 2 shard hosts' in said, said
  assert recovery.read_results(output) == recovery.expected_results(recovery.EVENTS)


def test_a_killed_coordinator_is_restarted_and_resumes_the_job_on_its_hosts(
  request, refract_bin, tmp_path
):
  # The coordinator is killed mid-job and started again on its state
  # directory: the hosts cancel what they ran, attach to the new one, and
  # it resumes the job from its latest checkpoint on them.
  state = ['--state_dir', tmp_path / 'state', '--checkpoint_interval', '200ms']
  with running_cluster(request, refract_bin, tmp_path, state) as cluster:
    output = tmp_path / 'out'
    output.mkdir()
    job = cluster.submit_recovery_job(output)
    cluster.restart_coordinator()
    request.node.refract_processes[0] = cluster.coordinator
    cluster.wait_attached(HOSTS)
    endpoint = cluster.coordinator.endpoint
    assert wait_for_end(cluster.coordinator, job, timeout_s=180) == 'DONE'
    assert recovery.distinct_events(endpoint, job) == recovery.EVENTS
    said = ' '.join(job_messages(endpoint, job))
    assert 'resumed from checkpoint' in said, said
  assert recovery.read_results(output) == recovery.expected_results(recovery.EVENTS)


def test_a_job_on_hosts_is_rescaled_2_3_1_with_exact_results(request, refract_bin, tmp_path):
  # A checkpointed streaming job asks for 2 shards over the 3 hosts; it is
  # moved onto 3 shards, then onto one, each time stopping at an epoch shard
  # 0 cuts for the savepoint and going on from it with every key group on
  # its new owner, placed over the hosts again.
  state = ['--state_dir', tmp_path / 'state', '--checkpoint_interval', '200ms']
  events = 4 * recovery.EVENTS
  with running_cluster(request, refract_bin, tmp_path, state) as cluster:
    output = tmp_path / 'out'
    output.mkdir()
    endpoint = cluster.coordinator.endpoint
    server = cluster.coordinator
    job = recovery.submit(endpoint, output, 'refract_shards=2', events=events)
    recovery.wait_for_results(output, server)
    rescaling.moved(refract_bin, endpoint, job, 3, server)
    rescaling.more_results(output, server)
    rescaling.moved(refract_bin, endpoint, job, 1, server)
    rescaling.more_results(output, server)
    assert wait_for_end(server, job, timeout_s=180) == 'DONE'
    assert recovery.distinct_events(endpoint, job) == events
    said = job_messages(endpoint, job)
    for placed in ['running on 2 engine shards', 'running on 3 engine shards on 3 shard hosts']:
      assert any(placed in m for m in said), said
    assert any('running on 1 engine shard on 1 shard host' in m for m in said), said
  assert recovery.read_results(output) == recovery.expected_results(events)


def test_a_job_left_one_shard_per_host_follows_a_host_that_joins(request, refract_bin, tmp_path):
  # A checkpointed streaming job that did not choose its number of shards
  # runs one per host: on two, then, once a third host attaches, on three,
  # moved at a savepoint with its key groups, under its id.
  state = ['--state_dir', tmp_path / 'state', '--checkpoint_interval', '200ms']
  events = 3 * recovery.EVENTS
  with running_cluster(request, refract_bin, tmp_path, state, hosts=2) as cluster:
    output = tmp_path / 'out'
    output.mkdir()
    endpoint = cluster.coordinator.endpoint
    job = recovery.submit(endpoint, output, events=events)
    recovery.wait_for_results(output, cluster.coordinator)
    request.node.refract_processes.append(cluster.start_host('joiner'))
    cluster.wait_attached(3)
    moved = 'runs on 3 shards from its savepoint (moved from 2 shards)'
    deadline = time.monotonic() + 60
    while not any(moved in m for m in job_messages(endpoint, job)):
      assert time.monotonic() < deadline, cluster.coordinator.log_tail()
      time.sleep(0.2)
    rescaling.more_results(output, cluster.coordinator)
    assert wait_for_end(cluster.coordinator, job, timeout_s=180) == 'DONE'
    assert recovery.distinct_events(endpoint, job) == events
    said = job_messages(endpoint, job)
    for placed in ['on 2 engine shards on 2 shard hosts', 'on 3 engine shards on 3 shard hosts']:
      assert any(placed in m for m in said), said
    assert 'worker connected' in cluster.hosts[-1].log_tail(10**7)
  assert recovery.read_results(output) == recovery.expected_results(events)


def test_a_groupbykey_past_the_memory_budget_spills_on_the_hosts(request, refract_bin, tmp_path):
  # 96 MiB grouped under 1 000 keys with a 16 MiB budget on the
  # coordinator: each host's share of it is small, its buffers spill to
  # its own spill space, and every value comes back once.
  budget = ['--memory_budget', '16m']
  with running_cluster(request, refract_bin, tmp_path, budget) as cluster:
    run = subprocess.run(
      [sys.executable, os.path.join(HERE, 'gbk_spill_pipeline.py'), cluster.coordinator.endpoint]
      + [str(a) for a in [96, 64, 1000, 0, 0, 0, 0, 'fixed']],
      capture_output=True,
      text=True,
      timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == 'DONE', run.stdout
    spilled = []
    for host in cluster.hosts:
      finished = [line for line in host.log_tail(10**7).splitlines() if 'engine finished' in line]
      assert finished, host.log_tail()
      spilled.append(spilled_bytes(finished[-1], 'spilled_bytes'))
  assert all(n > 0 for n in spilled), spilled


def word_text(folder):
  """Writes 2 000 lines of words (one with a quote) to `folder`/words.txt:
  the file, and how often each word is in it."""
  words = ['alpha', 'beta', 'gamma', 'delta', "o'neil"]
  lines = [' '.join(words[(i + j) % len(words)] for j in range(i % 7 + 1)) for i in range(2000)]
  text = folder / 'words.txt'
  text.write_text('\n'.join(lines) + '\n')
  want = {}
  for line in lines:
    for word in line.split():
      want[word] = want.get(word, 0) + 1
  return text, want


def read_word_counts(output):
  """The `word: count` lines Java's WordCount wrote to `output`."""
  got = {}
  for line in output.read_text().splitlines():
    word, count = line.rsplit(': ', 1)
    got[word] = int(count)
  return got


def test_javas_word_count_on_shard_hosts_counts_every_word(
  cluster, worker_pool, java_classpath, tmp_path
):
  # Java's WordCount (its finalisation uses side inputs and a GroupByKey)
  # with its workers from a Java worker pool: each host starts its own
  # workers there, and the counts are the text's.
  text, want = word_text(tmp_path)
  output = tmp_path / 'counts.txt'
  pool, _ = worker_pool
  code, printed = submit_java(
    java_classpath,
    'org.refract.examples.WordCount',
    cluster.coordinator.endpoint,
    pool,
    tmp_path / 'java-client.log',
    '--input=%s' % text,
    '--output=%s' % output,
  )
  assert code == 0, printed[-3000:] + cluster.coordinator.log_tail()
  assert read_word_counts(output) == want
  attached = sum('worker connected' in h.log_tail(10**7) for h in cluster.hosts)
  assert attached == HOSTS, 'a host started no Java worker'
