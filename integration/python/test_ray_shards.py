"""Shard hosts placed by Ray (integration/ray/ray_shards.py) on a local
Ray cluster of several nodes (ray.cluster_utils.Cluster, as the pool tests
start it): one `refract shard` per node, as an actor pinned to it, attached
to a coordinator; jobs run one shard per host; a node that joins gets a
host, a node removed takes its host along (Ray's failure detection). A
checkpointed streaming job running meanwhile follows them: onto the new
node's host at a savepoint, and back onto the hosts left from its last
checkpoint, with the model's results. Without Ray these tests skip.

The pipelines run in processes of their own: Ray forks this process to
start a node, and a fork of a process whose gRPC threads (a LOOPBACK
worker's) still run may crash.
"""

import os
import subprocess
import sys

import pytest

try:
  import ray  # noqa: F401  pylint: disable=unused-import
except ImportError as e:
  pytest.skip(
    'cannot import ray (%s): pip install -r integration/ray/requirements.txt' % e,
    allow_module_level=True,
  )

import test_recovery as recovery
from refract_testlib import (
  accepts,
  free_port,
  job_messages,
  read_log_tail,
  stop_process_group,
  wait_for_end,
)
from test_ray_pools import NODE, start_cluster, wait_until
from test_shard_hosts import ShardCluster

HERE = os.path.dirname(os.path.abspath(__file__))
PLACER = os.path.join(os.path.dirname(HERE), 'ray', 'ray_shards.py')
# From the placer's start: connecting, an actor process per node.
FIRST_HOSTS_S = 120


@pytest.fixture
def ray_cluster():
  """A Ray cluster of one head node, with its Ray Client server's port."""
  port = free_port()
  made = start_cluster(port)
  try:
    yield made, port
  finally:
    made.shutdown()


SUMS = r"""
import sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
n = int(sys.argv[2])
options = PipelineOptions(
  ['--runner=PortableRunner', '--job_endpoint=' + sys.argv[1], '--environment_type=LOOPBACK']
)
with beam.Pipeline(options=options) as p:
  sums = p | beam.Create(range(n)) | beam.Map(lambda x: (x % 5, x)) | beam.CombinePerKey(sum)
  assert_that(sums, equal_to([(k, sum(range(k, n, 5))) for k in range(5)]))
print('DONE')
"""


def run_sums(shards, n):
  """Runs a small grouping job to its end in a process of its own; the
  coordinator's log line placing it on hosts."""
  placed_before = shards.coordinator.log_tail(10**7).count('a run placed on shard hosts')
  done = subprocess.run(
    [sys.executable, '-c', SUMS, shards.coordinator.endpoint, str(n)],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.stdout.strip().endswith('DONE'), done.stderr[-3000:]
  placed = [
    line
    for line in shards.coordinator.log_tail(10**7).splitlines()
    if 'a run placed on shard hosts' in line
  ]
  assert len(placed) > placed_before, shards.coordinator.log_tail()
  return placed[-1]


def said(shards, job, text):
  """Whether the job's messages hold `text`."""
  return any(text in m for m in job_messages(shards.coordinator.endpoint, job))


@pytest.mark.timeout(300)
def test_one_shard_host_per_ray_node_following_nodes(request, refract_bin, tmp_path, ray_cluster):
  cluster, port = ray_cluster
  cluster.add_node(**NODE)
  head_ip = cluster.head_node.node_ip_address
  wait_until('the Ray Client server listening', lambda: accepts(port, head_ip), 60)
  state = ['--state_dir', tmp_path / 'state', '--checkpoint_interval', '200ms']
  shards = ShardCluster(refract_bin, tmp_path, state)
  request.node.refract_processes = [shards.coordinator]
  placer_log = tmp_path / 'ray_shards.log'
  placer = None
  try:
    shards.coordinator.wait_ready()
    with open(placer_log, 'wb') as log:
      placer = subprocess.Popen(
        [
          sys.executable,
          PLACER,
          '--address',
          'ray://%s:%d' % (head_ip, port),
          '--refract',
          refract_bin,
          '--poll_interval',
          '0.5',
          '--',
          '--coordinator',
          '127.0.0.1:%d' % shards.shard_port,
          '--secret_file',
          shards.secret,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
      )
    shards.wait_attached(2, timeout_s=FIRST_HOSTS_S)
    assert 'shards=2 hosts=2' in run_sums(shards, 100)

    # A streaming job, checkpointed, its number of shards left to the
    # hosts: it runs on the two nodes' hosts.
    output = tmp_path / 'out'
    output.mkdir()
    events = 4 * recovery.EVENTS
    job = recovery.submit(shards.coordinator.endpoint, output, events=events)
    recovery.wait_for_results(output, shards.coordinator)
    node = cluster.add_node(**NODE)
    shards.wait_attached(3, timeout_s=60)
    moved = 'runs on 3 shards from its savepoint (moved from 2 shards)'
    wait_until('the job moved onto the new host', lambda: said(shards, job, moved), 60)
    cluster.remove_node(node)
    # Ray ends the node's actor, and its host goes with the actor's process.
    wait_until('the removed node\'s host detached', lambda: shards.detached() >= 1, 30)
    shards.wait_attached(2)
    assert wait_for_end(shards.coordinator, job, timeout_s=180) == 'DONE'
    assert recovery.distinct_events(shards.coordinator.endpoint, job) == events
    assert said(shards, job, 'on 2 engine shards on 2 shard hosts')
    assert recovery.read_results(output) == recovery.expected_results(events)
    assert 'shards=2 hosts=2' in run_sums(shards, 50)
    # The placer's end takes every host along.
    placer.stdin.close()
    assert placer.wait(timeout=30) == 0, read_log_tail(placer_log)
    wait_until('every host detached', lambda: shards.attached() - shards.detached() == 0, 30)
  finally:
    if placer is not None and placer.poll() is None:
      stop_process_group(placer)
    shards.stop()
