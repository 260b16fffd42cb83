"""A job's engine shards on three virtual hosts (network namespaces, each
with its own address on a switch; netns_hosts.py), its coordinator on a
fourth, its checkpoints in an object store on a fifth. The streaming
recovery job (unbounded source, windows, user state, a file per window
and key) runs on the three shard hosts, checkpointing in epochs into the
bucket; one shard host's cable is pulled mid-job. Nothing resets its
connections: the pings of the control stream and of the exchange notice,
the job is retried from its last complete epoch on the two hosts left,
and it ends with the model's results, every event counted once.
"""

import os
import re
import time

import netns_hosts
import pytest
import test_recovery as recovery
from refract_testlib import job_messages, job_state, read_log_tail
from seaweedfs import SeaweedS3

OK, WHY = netns_hosts.available()
pytestmark = pytest.mark.skipif(not OK, reason=WHY)

JOB_PORT = 8073
SHARD_PORT = 8100
EXCHANGE_PORT = 8200
SHARD_HOSTS = ['s1', 's2', 's3']
# From the cut to the job's retry: the detection bound (10 s) and margin.
DETECTED_WITHIN_S = 15


class Logged:
  """A process's log, as the helpers of test_recovery read it."""

  def __init__(self, path):
    self.path = str(path)

  def log_tail(self, max_chars=6000):
    return read_log_tail(self.path, max_chars)


def attached(log):
  text = read_log_tail(log, 10**7)
  return len(re.findall('a shard host attached', text)) - len(
    re.findall('a shard host detached', text)
  )


def test_a_shard_host_cut_off_mid_job_is_replaced_by_the_rest(refract_bin, tmp_path):
  with netns_hosts.VirtualHosts(['coord', 'store'] + SHARD_HOSTS) as hosts:
    coord = hosts['coord']
    s3 = SeaweedS3(tmp_path / 's3', host=hosts['store'], client=coord).start()
    secret = tmp_path / 'cluster-secret'
    secret.write_text(os.urandom(24).hex() + '\n')
    os.chmod(secret, 0o600)
    log = tmp_path / 'coordinator.log'
    coordinator = coord.popen(
      [
        refract_bin,
        'serve',
        '--host',
        coord.address,
        '--job_port',
        JOB_PORT,
        '--shard_listen',
        '%s:%d' % (coord.address, SHARD_PORT),
        '--shard_secret_file',
        secret,
        '--state_dir',
        tmp_path / 'state',
        '--checkpoint_store',
        's3://%s/jobs' % s3.bucket,
        '--checkpoint_interval',
        '200ms',
        '--serve_http=false',
      ],
      log=log,
      env={**os.environ, **s3.env()},
    )
    coord.wait_listening(JOB_PORT, coordinator)
    for name in SHARD_HOSTS:
      host = hosts[name]
      host.popen(
        [
          refract_bin,
          'shard',
          '--coordinator',
          '%s:%d' % (coord.address, SHARD_PORT),
          '--secret_file',
          secret,
          '--listen',
          '%s:%d' % (host.address, EXCHANGE_PORT),
          '--name',
          name,
        ],
        log=tmp_path / ('%s.log' % name),
      )
    deadline = time.monotonic() + 60
    while attached(log) < len(SHARD_HOSTS):
      assert time.monotonic() < deadline, read_log_tail(log)
      time.sleep(0.1)

    endpoint = '%s:%d' % (coord.address, JOB_PORT)
    output = tmp_path / 'out'
    output.mkdir()
    job = recovery.submit(endpoint, output, host=coord)
    recovery.wait_for_results(output, Logged(log))
    cut_at = time.monotonic()
    hosts['s2'].link_down()
    retried_after = None
    deadline = time.monotonic() + 180
    while True:
      if retried_after is None and 'trying again' in read_log_tail(log, 10**7):
        retried_after = time.monotonic() - cut_at
      state = coord.in_namespace(lambda: job_state(endpoint, job))
      if state in ('DONE', 'FAILED', 'CANCELLED'):
        break
      assert time.monotonic() < deadline, read_log_tail(log)
      time.sleep(0.2)
    assert state == 'DONE', read_log_tail(log)
    print('cable pulled; the job retried on the rest %.1f s later' % (retried_after or -1))
    assert retried_after is not None and retried_after <= DETECTED_WITHIN_S, retried_after
    said = ' '.join(coord.in_namespace(lambda: job_messages(endpoint, job)))
    assert 'was lost' in said or 'lost its exchange' in said, said
    assert 'resumed from checkpoint' in said, said
    assert 'on 2 shard hosts' in said, said
    events = coord.in_namespace(lambda: recovery.distinct_events(endpoint, job))
    assert events == recovery.EVENTS
    # The checkpoints are in the bucket on the store's host.
    assert s3.objects('jobs'), 'no object under jobs/'
  assert recovery.read_results(output) == recovery.expected_results(recovery.EVENTS)
