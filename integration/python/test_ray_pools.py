"""Refract's Ray sidecar (integration/ray/ray_pools.py), run as `refract
serve --worker_pool ray://...` runs it, against a local Ray cluster of
several nodes (ray.cluster_utils.Cluster: one raylet per node on this
machine): one Beam worker pool per node, announced once it accepts
connections, following nodes that join and leave and actors that die, and
gone, workers included, when the sidecar's stdin closes.

Ray is not in integration/requirements.txt: setup.sh installs
integration/ray/requirements.txt too; without Ray these tests skip.
"""

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import pytest

try:
  from ray.cluster_utils import Cluster
except ImportError as e:
  pytest.skip(
    'cannot import ray (%s): pip install -r integration/ray/requirements.txt (setup.sh does)' % e,
    allow_module_level=True,
  )

from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.portability.api import beam_fn_api_pb2_grpc
from apache_beam.portability.api import endpoints_pb2

from refract_testlib import accepts
from refract_testlib import children_by_parent
from refract_testlib import free_port
from refract_testlib import read_log_tail
from refract_testlib import stat_fields
from refract_testlib import stop_process_group

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SIDECAR = os.path.join(REPO, 'integration', 'ray', 'ray_pools.py')
# Small nodes: the machine running the tests may have two cores.
NODE = {'num_cpus': 1, 'object_store_memory': 80 * 1024 * 1024}
# From the sidecar's start: connecting, a worker process per node, Beam's
# import in each actor.
FIRST_POOLS_S = 120
ACTOR_CLASS = 'RefractWorkerPool'


class Sidecar:
  """The sidecar as Refract runs it: stdin a pipe held open, stdout read
  as JSON lines, stderr kept in a file (shown when a test fails)."""

  def __init__(self, address, log_path):
    self.args = [sys.executable, SIDECAR, '--address', address, '--poll_interval', '0.5']
    self.log_path = str(log_path)
    self._log = open(self.log_path, 'wb')
    self.proc = subprocess.Popen(
      self.args,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=self._log,
      text=True,
      start_new_session=True,
    )
    self._lines = queue.Queue()
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self):
    for line in self.proc.stdout:
      self._lines.put(line)
    self._lines.put(None)

  def next_event(self, timeout_s):
    """The next event; fails on a line that is not a JSON object, or when
    none comes within `timeout_s`."""
    try:
      line = self._lines.get(timeout=timeout_s)
    except queue.Empty:
      raise AssertionError('no event within %ss' % timeout_s) from None
    assert line is not None, 'the sidecar closed stdout (exit %s)' % (self.proc.poll())
    event = json.loads(line)
    assert isinstance(event, dict), line
    return event

  def close_stdin(self):
    self.proc.stdin.close()

  def sigterm(self):
    self.proc.send_signal(signal.SIGTERM)

  def log_tail(self, max_chars=6000):
    return read_log_tail(self.log_path, max_chars)

  def stop(self):
    stop_process_group(self.proc)
    self._log.close()


@pytest.fixture
def client_port():
  """The port of the head's Ray Client server."""
  return free_port()


# How long Ray's GCS waits for a new node's raylet to register before it
# answers "cannot find the node" (30 s by default, which a loaded two-core
# machine now and then misses); the GCS reads it from its environment.
os.environ.setdefault('RAY_raylet_start_wait_time_s', '120')


def start_cluster(client_port):
  """A Ray cluster of one head node. Should the head still not come up,
  the processes that attempt started are killed, the tail of Ray's own
  logs is printed, and it is made once more."""
  before = descendants()
  args = dict(NODE, include_dashboard=False, ray_client_server_port=client_port)
  try:
    return Cluster(initialize_head=True, head_node_args=args)
  except Exception as e:  # pylint: disable=broad-except
    print('Ray head did not start (%s); trying once more' % e, file=sys.stderr)
    print_ray_log_tails()
    for pid in descendants() - before:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    return Cluster(initialize_head=True, head_node_args=args)


def print_ray_log_tails():
  """The ends of the GCS's and raylets' logs of Ray's latest session,
  to stderr: why a node did not start."""
  logs = os.path.join(tempfile.gettempdir(), 'ray', 'session_latest', 'logs')
  for name in ('gcs_server.err', 'gcs_server.out', 'raylet.err', 'raylet.out'):
    path = os.path.join(logs, name)
    if os.path.exists(path):
      print('--- %s ---\n%s' % (path, read_log_tail(path, 3000)), file=sys.stderr)


def descendants():
  """The pids of this process's children, theirs, and so on (from /proc)."""
  children = children_by_parent()
  found, todo = set(), [os.getpid()]
  while todo:
    for child in children.get(todo.pop(), []):
      if child not in found:
        found.add(child)
        todo.append(child)
  return found


@pytest.fixture
def cluster(client_port):
  """A Ray cluster of one (head) node; tests add more."""
  ray_cluster = start_cluster(client_port)
  try:
    yield ray_cluster
  finally:
    ray_cluster.shutdown()


@pytest.fixture
def sidecar_for(request, tmp_path):
  """Starts sidecars (`sidecar_for(address)`), stopped after the test."""
  started = []
  request.node.refract_processes = started

  def start(address):
    sidecar = Sidecar(address, tmp_path / ('sidecar-%d.log' % len(started)))
    started.append(sidecar)
    return sidecar

  yield start
  for sidecar in started:
    sidecar.stop()


def expect_adds(sidecar, node_ids, timeout_s):
  """Reads events until every node in `node_ids` has an add; returns
  {node id: event}. Any other event fails."""
  deadline = time.monotonic() + timeout_s
  adds = {}
  while set(adds) != set(node_ids):
    event = sidecar.next_event(max(0.1, deadline - time.monotonic()))
    assert event['event'] == 'add' and event['node'] in node_ids, event
    adds[event['node']] = event
  return adds


def assert_serves_grpc(pool):
  with grpc.insecure_channel(pool) as channel:
    grpc.channel_ready_future(channel).result(timeout=10)


def live_pool_actors(ray_cluster):
  return [
    a
    for a in ray_cluster.global_state.actor_table(None).values()
    if a['ActorClassName'] == ACTOR_CLASS and a['State'] != 'DEAD'
  ]


def pids_matching(pattern):
  found = subprocess.run(
    ['pgrep', '-f', '--', pattern], capture_output=True, text=True, check=False
  )
  return [int(p) for p in found.stdout.split()]


def parent_pid(pid):
  fields = stat_fields(pid)
  assert fields, 'process %d is gone' % pid
  return int(fields[1])


def wait_until(what, condition, timeout_s):
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert time.monotonic() < deadline, '%s: not within %ss' % (what, timeout_s)
    time.sleep(0.2)


def assert_all_gone(sidecar, ray_cluster, stop):
  """After `stop(sidecar)` the sidecar exits (0) within 10 s, leaving no
  pool actor, actor process or worker behind."""
  stopped = time.monotonic()
  stop(sidecar)
  assert sidecar.proc.wait(timeout=10) == 0, sidecar.log_tail()
  print('sidecar exited %.1fs after %s' % (time.monotonic() - stopped, stop.__name__))
  wait_until('pool actors dead', lambda: not live_pool_actors(ray_cluster), 10)
  wait_until('pool processes gone', lambda: not pids_matching('ray::' + ACTOR_CLASS), 10)
  wait_until('workers gone', lambda: not pids_matching('--boot_worker'), 10)


def start_worker(pool, endpoint, worker_id):
  """Calls StartWorker on `pool` with every Fn API endpoint at `endpoint`."""
  url = endpoints_pb2.ApiServiceDescriptor(url=endpoint)
  with grpc.insecure_channel(pool) as channel:
    return beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(channel).StartWorker(
      beam_fn_api_pb2.StartWorkerRequest(
        worker_id=worker_id,
        control_endpoint=url,
        logging_endpoint=url,
        provision_endpoint=url,
        artifact_endpoint=url,
      ),
      timeout=30,
    )


@pytest.fixture
def silent_endpoint():
  """An address that accepts TCP connections and never answers: a worker
  told to provision itself there waits (60 s) instead of failing at once."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    s.listen(16)
    yield '127.0.0.1:%d' % s.getsockname()[1]


def test_one_pool_per_node_following_nodes_that_join_and_leave(cluster, client_port, sidecar_for):
  """Through a Ray Client address, as `--worker_pool ray://HEAD:PORT`."""
  cluster.add_node(**NODE)
  first = [n.node_id for n in cluster.list_all_nodes()]
  head_ip = cluster.head_node.node_ip_address
  # The head starts its Ray Client server as a process of its own, which
  # may still be importing when the cluster is up: a user's sidecar is
  # pointed at a head that serves.
  wait_until('the Ray Client server listening', lambda: accepts(client_port, head_ip), 60)
  started = time.monotonic()
  sidecar = sidecar_for('ray://%s:%d' % (head_ip, client_port))

  adds = expect_adds(sidecar, first, FIRST_POOLS_S)
  print('first pools up in %.1fs' % (time.monotonic() - started))
  ips = {n.node_id: n.node_ip_address for n in cluster.list_all_nodes()}
  for node_id, event in adds.items():
    assert event['pool'].startswith(ips[node_id] + ':'), event
    assert event['cpus'] == 1, event
    assert_serves_grpc(event['pool'])
  assert len({e['pool'] for e in adds.values()}) == 2

  joined = time.monotonic()
  node = cluster.add_node(**dict(NODE, num_cpus=2))
  added = expect_adds(sidecar, [node.node_id], 60)[node.node_id]
  print('pool on a new node up %.1fs after it joined' % (time.monotonic() - joined))
  assert added['cpus'] == 2, added
  assert_serves_grpc(added['pool'])

  removed_at = time.monotonic()
  cluster.remove_node(node)
  event = sidecar.next_event(15)
  print('remove event %.1fs after the node was removed' % (time.monotonic() - removed_at))
  assert event == {'event': 'remove', 'pool': added['pool'], 'node': node.node_id}

  assert_all_gone(sidecar, cluster, Sidecar.close_stdin)


def test_a_dead_actor_is_replaced_and_its_workers_end(cluster, sidecar_for, silent_endpoint):
  """Through the GCS address this time. A worker the pool starts runs this
  file's boot mode; killing the actor (not the node) is announced as a
  remove, the node gets a new pool, and the worker ends with its actor."""
  head = cluster.head_node.node_id
  sidecar = sidecar_for(cluster.address)
  pool = expect_adds(sidecar, [head], FIRST_POOLS_S)[head]['pool']

  response = start_worker(pool, silent_endpoint, 'worker-1')
  assert response.error == '', response.error
  wait_until('worker started', lambda: pids_matching('--boot_worker'), 30)
  worker = pids_matching('--boot_worker')[0]
  os.kill(parent_pid(worker), signal.SIGKILL)

  assert sidecar.next_event(15) == {'event': 'remove', 'pool': pool, 'node': head}
  wait_until('orphaned worker gone', lambda: not pids_matching('--boot_worker'), 10)
  replacement = expect_adds(sidecar, [head], 60)[head]
  assert replacement['pool'] != pool
  assert_serves_grpc(replacement['pool'])

  # Stopping the sidecar (SIGTERM, this time) stops its actors' workers too.
  response = start_worker(replacement['pool'], silent_endpoint, 'worker-2')
  assert response.error == '', response.error
  wait_until('worker started', lambda: pids_matching('--boot_worker'), 30)
  assert_all_gone(sidecar, cluster, Sidecar.sigterm)


@pytest.mark.parametrize('address', ['127.0.0.1:{port}', 'ray://127.0.0.1:{port}'])
def test_an_address_where_no_ray_answers_is_an_error(sidecar_for, address):
  sidecar = sidecar_for(address.format(port=free_port()))
  event = sidecar.next_event(30)
  assert event['event'] == 'error', event
  assert 'cannot connect to Ray' in event['message'], event
  assert sidecar.proc.wait(timeout=10) == 1
