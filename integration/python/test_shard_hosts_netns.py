"""A job's engine shards on three virtual hosts (network namespaces, each
with its own address on a switch; netns_hosts.py), its coordinator on a
fourth, its job records, staged files and checkpoints in an object store
(SeaweedFS's S3 gateway) on a fifth. Nothing reaches another host but
through its address, as between machines.

- Python's keyed pipelines (GroupByKey, CombinePerKey, side inputs, state
  and timers, sessions), batch and streaming, and Java's WordCount give
  the results one server gives, with every SDK worker on a shard host.
- The streaming recovery job (an unbounded source, windows, user state, a
  file per window and key, checkpointing in epochs every 200 ms into the
  bucket) ends DONE with the model's results and every event counted once
  after each failure a cluster meets: a shard host's processes all
  killed (kill -9), its cable pulled (nothing resets its connections: the
  pings of the control stream and of the exchange notice), the
  coordinator killed and started again on an empty disk (everything it
  resumes from is in the bucket), and a rescale 2 -> 3 -> 1 mid-job.
"""

import contextlib
import datetime
import json
import os
import re
import sys
import time

import netns_hosts
import pytest
import test_recovery as recovery
import test_rescale as rescaling
from conftest import POOL_MAIN
from refract_testlib import read_log_tail
from seaweedfs import SeaweedS3
from test_shard_hosts import checkpoints_written, read_word_counts, word_text

OK, WHY = netns_hosts.available()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINES = os.path.join(HERE, 'shard_host_pipelines.py')
PROBE = os.path.join(HERE, 'job_probe.py')
JOB_PORT = 8073
SHARD_PORT = 8100
EXCHANGE_PORT = 8200
POOL_PORT = 8300
SHARD_HOSTS = ['s1', 's2', 's3']
# From a host's loss to the job's retry: the detection bound (10 s) and
# margin.
DETECTED_WITHIN_S = 15
ENDED = ('DONE', 'FAILED', 'CANCELLED', 'UPDATED', 'DRAINED')


class NetnsCluster:
  """A coordinator on virtual host 'coord' and shard hosts on the others,
  every process started in its host's namespace; the test talks to the
  coordinator from 'coord'."""

  def __init__(self, hosts, refract_bin, tmp_path, s3):
    self.hosts = hosts
    self.coord = hosts['coord']
    self.binary = refract_bin
    self.tmp = tmp_path
    self.s3 = s3
    self.secret = tmp_path / 'cluster-secret'
    self.secret.write_text(os.urandom(24).hex() + '\n')
    os.chmod(self.secret, 0o600)
    self.endpoint = '%s:%d' % (self.coord.address, JOB_PORT)
    self.coordinator = None
    self.log = None
    self.starts = 0

  def start_coordinator(self, state_dir):
    """Starts `refract serve` on 'coord' with its state under `state_dir`
    and its store in the bucket; waits until it takes jobs."""
    self.starts += 1
    self.log = self.tmp / ('coordinator-%d.log' % self.starts)
    self.coordinator = self.coord.popen(
      [
        self.binary,
        'serve',
        '--host',
        self.coord.address,
        '--job_port',
        JOB_PORT,
        '--shard_listen',
        '%s:%d' % (self.coord.address, SHARD_PORT),
        '--shard_secret_file',
        self.secret,
        '--state_dir',
        state_dir,
        '--checkpoint_store',
        's3://%s/jobs' % self.s3.bucket,
        '--checkpoint_interval',
        '200ms',
        '--serve_http=false',
      ],
      log=self.log,
      env={**os.environ, **self.s3.env()},
    )
    self.coord.wait_listening(JOB_PORT, self.coordinator)

  def start_shard_host(self, name):
    """Starts `refract shard` on host `name`, its exchange on the host's
    address; its workers can import this folder's modules."""
    host = self.hosts[name]
    host.popen(
      [
        self.binary,
        'shard',
        '--coordinator',
        '%s:%d' % (self.coord.address, SHARD_PORT),
        '--secret_file',
        self.secret,
        '--listen',
        '%s:%d' % (host.address, EXCHANGE_PORT),
        '--name',
        name,
      ],
      log=self.tmp / ('%s.log' % name),
      env={**os.environ, 'PYTHONPATH': HERE},
    )

  def attached(self):
    """Shard hosts attached to the running coordinator now."""
    text = read_log_tail(self.log, 10**7)
    return len(re.findall('a shard host attached', text)) - len(
      re.findall('a shard host detached', text)
    )

  def wait_attached(self, count, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while self.attached() < count:
      assert time.monotonic() < deadline, self.log_tail()
      time.sleep(0.1)

  def log_tail(self, max_chars=6000):
    """The coordinator's log (as test_recovery's helpers read a server's)."""
    return read_log_tail(self.log, max_chars)

  def probe(self, job, *what):
    """What the coordinator's job service says of `job` (job_probe.py,
    run on 'coord')."""
    done = self.coord.run([sys.executable, PROBE, self.endpoint, job, *what], timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])

  def state(self, job):
    return self.probe(job, 'state')

  def said(self, job):
    """The job's messages, joined."""
    return ' '.join(self.probe(job, 'messages'))

  def distinct_events(self, job):
    return self.probe(job, 'counter', 'distinct_events')

  def logged_at(self, text):
    """When (seconds since the epoch) the coordinator's log first held
    `text`, or None."""
    for line in read_log_tail(self.log, 10**7).splitlines():
      if text in line:
        stamp = line.split()[0].rstrip('Z')
        return (
          datetime.datetime.fromisoformat(stamp).replace(tzinfo=datetime.timezone.utc).timestamp()
        )
    return None

  def wait_for_end(self, job, timeout_s=180):
    """Waits until the job ends: its state."""
    deadline = time.monotonic() + timeout_s
    while True:
      state = self.state(job)
      if state in ENDED:
        return state
      assert time.monotonic() < deadline, self.log_tail()
      time.sleep(0.2)

  def wait_for_checkpoint(self, job, timeout_s=60):
    """Waits until `refract status` counts a checkpoint of the job written
    (an epoch every shard cut, in the bucket), so that a failure from here
    on has one to resume from."""
    deadline = time.monotonic() + timeout_s
    while True:
      done = self.coord.run(
        [self.binary, 'status', job, '--job_endpoint', self.endpoint], timeout=30
      )
      if checkpoints_written(done.stdout) > 0:
        return
      assert time.monotonic() < deadline, done.stdout + done.stderr + self.log_tail()
      time.sleep(0.2)

  def submit_recovery_job(self, output, *experiments, **pipeline):
    """Submits the streaming recovery pipeline from 'coord': its job id,
    once it wrote its first result and its first checkpoint."""
    job = recovery.submit(self.endpoint, output, *experiments, host=self.coord, **pipeline)
    recovery.wait_for_results(output, self)
    self.wait_for_checkpoint(job)
    return job


@contextlib.contextmanager
def netns_cluster(refract_bin, tmp_path):
  """A coordinator, three shard hosts attached to it, and the object store,
  each on a virtual host of its own."""
  with netns_hosts.VirtualHosts(['coord', 'store'] + SHARD_HOSTS) as hosts:
    s3 = SeaweedS3(tmp_path / 's3', host=hosts['store'], client=hosts['coord']).start()
    cluster = NetnsCluster(hosts, refract_bin, tmp_path, s3)
    cluster.start_coordinator(tmp_path / 'state')
    for name in SHARD_HOSTS:
      cluster.start_shard_host(name)
    cluster.wait_attached(len(SHARD_HOSTS))
    yield cluster


def recovered_exactly(cluster, job, output, events=recovery.EVENTS):
  """The job counted every event once and wrote the model's results."""
  assert cluster.distinct_events(job) == events
  assert recovery.read_results(output) == recovery.expected_results(events)


@pytest.mark.parametrize('mode', ['batch', 'streaming'])
def test_python_pipelines_on_netns_hosts_match_one_engine(refract_bin, tmp_path, mode):
  with netns_cluster(refract_bin, tmp_path) as cluster:
    run = cluster.coord.run(
      [sys.executable, PIPELINES, '--job_endpoint', cluster.endpoint, '--boot', recovery.BOOT]
      + (['--streaming'] if mode == 'streaming' else []),
      timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:] + cluster.log_tail()
    job, state = run.stdout.split()[-2:]
    assert state == 'DONE'
    said = cluster.said(job)
    assert 'running on 3 engine shards on 3 shard hosts' in said, said
    coordinator_log = read_log_tail(cluster.log, 10**7)
    assert 'worker connected' not in coordinator_log
    for name in SHARD_HOSTS:
      host_log = read_log_tail(tmp_path / ('%s.log' % name), 10**7)
      assert 'worker connected' in host_log, host_log[-3000:]


def test_javas_word_count_on_netns_hosts_counts_every_word(refract_bin, tmp_path, java_classpath):
  # Each shard host has a Java worker pool of its own beside it (as a
  # sidecar would be), at the same local address; the client on 'coord'
  # names that address, and each host's shards start their workers there.
  text, want = word_text(tmp_path)
  output = tmp_path / 'counts.txt'
  with netns_cluster(refract_bin, tmp_path) as cluster:
    for name in SHARD_HOSTS:
      host = cluster.hosts[name]
      pool = host.popen(
        ['java', '-Xmx256m', '-cp', java_classpath, POOL_MAIN, POOL_PORT, '512m'],
        log=tmp_path / ('%s-pool.log' % name),
      )
      host.wait_listening(POOL_PORT, pool, addr='127.0.0.1')
    run = cluster.coord.run(
      [
        'java',
        '-cp',
        java_classpath,
        'org.refract.examples.WordCount',
        '--runner=PortableRunner',
        '--jobEndpoint=' + cluster.endpoint,
        '--defaultEnvironmentType=EXTERNAL',
        '--defaultEnvironmentConfig=localhost:%d' % POOL_PORT,
        '--input=%s' % text,
        '--output=%s' % output,
      ],
      timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:] + cluster.log_tail()
    for name in SHARD_HOSTS:
      host_log = read_log_tail(tmp_path / ('%s.log' % name), 10**7)
      assert 'worker connected' in host_log, '%s started no Java worker' % name
  assert read_word_counts(output) == want


@pytest.mark.parametrize('failure', ['killed', 'cut_off'])
def test_a_lost_shard_host_is_replaced_by_the_rest(refract_bin, tmp_path, failure):
  output = tmp_path / 'out'
  output.mkdir()
  with netns_cluster(refract_bin, tmp_path) as cluster:
    job = cluster.submit_recovery_job(output)
    victim = cluster.hosts['s2']
    lost_at = time.time()
    if failure == 'killed':
      victim.kill_all()
    else:
      victim.link_down()
    assert cluster.wait_for_end(job) == 'DONE', cluster.log_tail()
    retried_at = cluster.logged_at('trying again')
    assert retried_at is not None, cluster.log_tail()
    retried_after = retried_at - lost_at
    print('shard host %s; retried on the rest %.1f s later' % (failure, retried_after))
    assert retried_after <= DETECTED_WITHIN_S, retried_after
    said = cluster.said(job)
    assert 'was lost' in said or 'lost its exchange' in said, said
    assert 'resumed from checkpoint' in said, said
    assert 'on 2 shard hosts' in said, said
    recovered_exactly(cluster, job, output)
    # The checkpoints are in the bucket on the store's host.
    assert cluster.s3.objects('jobs'), 'no object under jobs/'


def test_a_killed_coordinator_resumes_the_job_from_the_bucket(refract_bin, tmp_path):
  # The coordinator's host loses every process; another coordinator starts
  # there on an empty state directory (a new disk), finds the job's record,
  # staged files and latest checkpoint in the bucket, and resumes it on the
  # shard hosts once they attach again.
  output = tmp_path / 'out'
  output.mkdir()
  with netns_cluster(refract_bin, tmp_path) as cluster:
    job = cluster.submit_recovery_job(output)
    cluster.coord.kill_all()
    cluster.start_coordinator(tmp_path / 'state-on-a-new-disk')
    cluster.wait_attached(len(SHARD_HOSTS))
    assert cluster.wait_for_end(job) == 'DONE', cluster.log_tail()
    said = cluster.said(job)
    assert 'resumed from checkpoint' in said, said
    assert 'on 3 shard hosts' in said, said
    recovered_exactly(cluster, job, output)


def test_a_streaming_job_is_rescaled_2_3_1_across_hosts(refract_bin, tmp_path):
  output = tmp_path / 'out'
  output.mkdir()
  events = 4 * recovery.EVENTS
  with netns_cluster(refract_bin, tmp_path) as cluster:
    job = cluster.submit_recovery_job(output, 'refract_shards=2', events=events)
    for shards in (3, 1):
      done = cluster.coord.run(
        [cluster.binary, 'rescale', job, '--shards', shards, '--job_endpoint', cluster.endpoint],
        timeout=120,
      )
      assert done.returncode == 0, done.stderr + cluster.log_tail()
      assert 'to %d shards' % shards in done.stdout, done.stdout
      rescaling.more_results(output, cluster)
    assert cluster.wait_for_end(job) == 'DONE', cluster.log_tail()
    said = cluster.said(job)
    for placed in [
      'running on 2 engine shards on 2 shard hosts',
      'running on 3 engine shards on 3 shard hosts',
      'running on 1 engine shard on 1 shard host',
    ]:
      assert placed in said, said
    recovered_exactly(cluster, job, output, events)
