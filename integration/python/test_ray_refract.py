"""Refract on a Ray cluster, end to end: `refract serve --worker_pool
ray://HEAD:PORT` running real Beam Python pipelines on the Beam worker pools
its Ray sidecar (integration/ray/ray_pools.py) places on the nodes of a
local cluster (ray.cluster_utils.Cluster: a head and two worker nodes, one
raylet each on this machine, 1 CPU each).

The pipelines are submitted as users do (`--runner=PortableRunner
--job_endpoint=...`, no --environment_type): Python's default environment,
DOCKER apache/beam_python3.X_sdk, is the one Refract sends to Ray pools, and
no job option asks for a number of workers, so a job gets one worker per
node CPU, spread over the nodes.

  test_batch_job_runs_on_every_node
      a GroupByKey and a CombinePerKey over a few thousand elements end DONE
      with exact results, `refract pools list` showing one pool per node and
      elements handled by workers on more than one node;
  test_node_killed_mid_job
      a worker node killed (`remove_node(allow_graceful=False)`: its raylet
      and processes SIGKILLed) while a slow job runs on all three: the job
      still ends DONE with exact results; how long the job's progress
      stalled is measured and printed;
  test_node_added_mid_job
      a node joining while a job runs gets a pool, which `refract pools
      list` shows and on which the running job starts a worker.

The cluster is reached through the head's Ray Client server (`ray://`, the
head started with cluster_utils' `ray_client_server_port`), as `--worker_pool
ray://HEAD:PORT` is meant to be used. (A GCS address would do too, but the
sidecar turns Ray's token authentication on whenever ~/.ray/auth_token
exists, and a driver that expects tokens cannot create actors on a cluster
started without them, as cluster_utils' is; through Ray Client the driver
runs on the head, with the cluster's own settings.)

This file is also the pipelines' script (`python test_ray_refract.py
pipeline NAME ...`): run as __main__, its DoFns travel to the workers by
value, with nothing to import on the nodes but Beam. Each DoFn notes, in a
file named after the worker that ran it (the WORKER_ID the sidecar's worker
boot sets), which elements it handled and when: the server's log says which
pool, hence which node, started each worker.

Ray is not in integration/requirements.txt: setup.sh installs
integration/ray/requirements.txt too; without Ray these tests skip.
"""

import argparse
import datetime
import os
import re
import subprocess
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

import refract_testlib
from refract_testlib import RefractProcess
from refract_testlib import RefractServer
from refract_testlib import free_port

# ---------------------------------------------------------------------------
# The pipelines (run by the tests as `python THIS_FILE pipeline NAME ...`).
# ---------------------------------------------------------------------------


class Touch(beam.DoFn):
  """Sleeps `sleep` seconds per element and appends `ELEMENT TIME` to
  PROGRESS/WORKER_ID.log, line buffered: the tests read from it which
  worker did what, and when."""

  def __init__(self, progress, sleep):
    self.progress = progress
    self.sleep = sleep
    self.log = None

  def setup(self):
    os.makedirs(self.progress, exist_ok=True)
    name = os.environ.get('WORKER_ID') or 'pid-%d' % os.getpid()
    self.log = open(os.path.join(self.progress, name + '.log'), 'a', buffering=1)

  def process(self, i):
    if self.sleep:
      time.sleep(self.sleep)
    self.log.write('%d %.6f\n' % (i, time.time()))
    yield i

  def teardown(self):
    if self.log:
      self.log.close()


def describe_group(kv):
  k, values = kv
  values = list(values)
  return 'group %d %d %d %d %d' % (k, len(values), sum(values), min(values), max(values))


def count_and_sum(p, args):
  """Per key (i % keys): the number and the sum of the elements, grouped
  with a GroupByKey (with their least and greatest), and the sum again,
  of the squares this time, with a CombinePerKey."""
  keyed = (
    p
    | beam.Create(list(range(args.elements)))
    | beam.Reshuffle()
    | 'Touch' >> beam.ParDo(Touch(args.output + '.progress', args.sleep))
    | 'Key' >> beam.Map(lambda i, keys=args.keys: (i % keys, i))
  )
  grouped = keyed | beam.GroupByKey() | 'Describe' >> beam.Map(describe_group)
  combined = (
    keyed
    | 'Square' >> beam.MapTuple(lambda k, i: (k, i * i))
    | beam.CombinePerKey(sum)
    | 'Format' >> beam.MapTuple(lambda k, s: 'squares %d %d' % (k, s))
  )
  return (grouped, combined) | beam.Flatten()


def expected_lines(elements, keys):
  """What count_and_sum writes, sorted."""
  lines = []
  for k in range(min(keys, elements)):
    values = range(k, elements, keys)
    lines.append('group %d %d %d %d %d' % (k, len(values), sum(values), values[0], values[-1]))
    lines.append('squares %d %d' % (k, sum(i * i for i in values)))
  return sorted(lines)


def main(argv):
  """`pipeline count_and_sum --job_endpoint E --output PREFIX [...]`:
  submits the pipeline; prints `JOB_ID id`, then `FINAL_STATE state`,
  exiting 0 only if it is DONE."""
  parser = argparse.ArgumentParser()
  parser.add_argument('command', choices=['pipeline'])
  parser.add_argument('name', choices=['count_and_sum'])
  parser.add_argument('--job_endpoint', required=True)
  parser.add_argument('--output', required=True)
  parser.add_argument('--elements', type=int, default=3000)
  parser.add_argument('--keys', type=int, default=31)
  parser.add_argument('--sleep', type=float, default=0.0)
  args, beam_args = parser.parse_known_args(argv)
  # No --environment_type: Python's default, DOCKER, naming Beam's image
  # apache/beam_python3.X_sdk:<version>, which is what goes to Ray pools.
  options = PipelineOptions(
    ['--runner=PortableRunner', '--job_endpoint=' + args.job_endpoint] + beam_args
  )
  p = beam.Pipeline(options=options)
  _ = count_and_sum(p, args) | beam.io.WriteToText(args.output)
  result = p.run()
  print('JOB_ID', result._job_id, flush=True)  # pylint: disable=protected-access
  state = result.wait_until_finish()
  print('FINAL_STATE', state, flush=True)
  return 0 if state == 'DONE' else 1


if __name__ == '__main__':
  refract_testlib.exit_now(main(sys.argv[1:]))

# ---------------------------------------------------------------------------
# The tests.
# ---------------------------------------------------------------------------

# Imported here, not at the top: run as the pipelines' script (above),
# the file exits before needing pytest (or Ray).
# pylint: disable=wrong-import-position
import pytest  # noqa: E402

try:
  from ray.cluster_utils import Cluster
except ImportError as e:
  pytest.skip(
    'cannot import ray (%s): pip install -r integration/ray/requirements.txt (setup.sh does)' % e,
    allow_module_level=True,
  )

# Longer than the suite's default per test: a Ray cluster and its pools
# start in each test.
pytestmark = pytest.mark.timeout(600)

# Small nodes: the machine running the tests may have two cores.
NODE = {'num_cpus': 1, 'object_store_memory': 80 * 1024 * 1024}
# From the server's start: the sidecar connecting, a Ray worker process per
# node, Beam's import in each actor (about 10 s here).
POOLS_UP_S = 120
PIPELINE_TIMEOUT_S = 240
KEYS = 31
# The batch job: a few seconds of work in all, enough for every worker
# to get some.
BATCH_ELEMENTS = 3000
BATCH_SLEEP_S = 0.001
# The fault tests' job: 60 s of sleeping in all, shared by one worker per
# node (three, then two), handed out in bundles that Refract splits.
SLOW_ELEMENTS = 3000
SLOW_SLEEP_S = 0.02
# A node lost mid-job must have been noticed, and its unfinished work
# resumed elsewhere, within Refract's --worker_liveness_timeout (12 s by
# default) and some slack for a loaded two-core machine.
RECOVERY_BOUND_S = 20
# The node-added test's job: long enough (about 13 s on three workers) for
# a node to join and its pool to come up while it runs.
ADDED_ELEMENTS = 2000


@pytest.fixture(scope='module')
def pools_bin():
  """REFRACT_BIN, which must know `--worker_pool ray://...` and `refract
  pools`."""
  path = os.environ.get('REFRACT_BIN')
  if not path:
    pytest.fail('set REFRACT_BIN to the refract binary under test', pytrace=False)
  path = os.path.abspath(path)
  usage = subprocess.run(
    [path, 'serve', '--help'], capture_output=True, text=True, check=False
  ).stdout
  if 'ray://' not in usage:
    pytest.fail('%s has no --worker_pool ray://: not a build with Ray pools' % path, pytrace=False)
  return path


class RayCluster:
  """A head and two worker nodes (cluster_utils: a raylet each, on this
  machine), the head serving Ray Client on `client_port`."""

  def __init__(self):
    self.client_port = free_port()
    self.cluster = Cluster(
      initialize_head=True,
      head_node_args=dict(NODE, include_dashboard=False, ray_client_server_port=self.client_port),
    )
    self.workers = [self.cluster.add_node(**NODE) for _ in range(2)]

  @property
  def address(self):
    """The `--worker_pool` value: the head's Ray Client server."""
    return 'ray://%s:%d' % (self.cluster.head_node.node_ip_address, self.client_port)

  def node_ids(self):
    return {n.node_id for n in self.cluster.list_all_nodes()}

  def shutdown(self):
    self.cluster.shutdown()


#: Ray's message when a node's raylet did not register within its fixed
#: 30 s (ray/_private/node.py), which a loaded 2-core machine can miss.
RAYLET_START_TIMEOUT = 'timed out during startup'


def start_ray_cluster():
  """A RayCluster; a second try when a raylet missed Ray's start timeout
  (what the first started is stopped)."""
  try:
    return RayCluster()
  except Exception as e:  # pylint: disable=broad-except
    if RAYLET_START_TIMEOUT not in str(e):
      raise
    print('a Ray node did not start within 30 s; starting the cluster again')
    # What the first try started belongs to no Cluster object to shut
    # down; no other Ray cluster runs while a test sets one up.
    subprocess.run(
      [sys.executable, '-m', 'ray.scripts.scripts', 'stop', '--force'],
      capture_output=True,
      timeout=120,
      check=False,
    )
    return RayCluster()


@pytest.fixture
def ray_cluster():
  started = time.monotonic()
  cluster = start_ray_cluster()
  print('Ray cluster of 3 nodes up in %.1fs' % (time.monotonic() - started))
  try:
    yield cluster
  finally:
    cluster.shutdown()


class Job:
  """count_and_sum submitted by its client (this file, run as a script)
  and waited for; its output and progress files in `work`."""

  def __init__(self, server, work, elements, sleep):
    self.elements = elements
    self.output = str(work / 'out')
    self.progress_dir = self.output + '.progress'
    self.started = time.monotonic()
    cmd = [
      sys.executable,
      os.path.abspath(__file__),
      'pipeline',
      'count_and_sum',
      '--job_endpoint',
      server.endpoint,
      '--output',
      self.output,
      '--elements',
      str(elements),
      '--keys',
      str(KEYS),
      '--sleep',
      str(sleep),
    ]
    self.client = RefractProcess(cmd, work / 'client.log')

  def finish(self, timeout_s=PIPELINE_TIMEOUT_S):
    """Waits for the client; the job's final state."""
    try:
      self.client.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      raise AssertionError(
        'the job did not end within %ss:\n%s' % (timeout_s, self.client.log_tail())
      ) from None
    self.seconds = time.monotonic() - self.started
    for line in self.client.log_tail(1 << 30).splitlines():
      if line.startswith('FINAL_STATE '):
        return line.split()[1]
    return 'no final state (exit %s)' % self.client.proc.returncode

  def assert_exact(self):
    directory, prefix = os.path.split(self.output)
    lines = []
    for name in sorted(os.listdir(directory)):
      if name.startswith(prefix + '-'):
        with open(os.path.join(directory, name)) as f:
          lines.extend(f.read().splitlines())
    want = expected_lines(self.elements, KEYS)
    got = sorted(lines)
    assert got == want, '%d lines, %d expected; missing %s; unexpected %s' % (
      len(got),
      len(want),
      sorted(set(want) - set(got))[:5],
      sorted(set(got) - set(want))[:5],
    )

  def progress(self):
    """(time, element, worker id) of every element Touch handled so far,
    by time."""
    found = []
    if not os.path.isdir(self.progress_dir):
      return found
    for name in os.listdir(self.progress_dir):
      worker = name[: -len('.log')]
      with open(os.path.join(self.progress_dir, name)) as f:
        for line in f:
          parts = line.split()
          if len(parts) == 2:
            found.append((float(parts[1]), int(parts[0]), worker))
    return sorted(found)


@pytest.fixture
def ray_server(request, pools_bin, ray_cluster, tmp_path):
  """`refract serve --worker_pool ray://HEAD:PORT` for `ray_cluster`;
  yields it once every node has a pool. Its log, and the client's of a
  test's job, are in the report of a failing test."""
  server = RefractServer(
    pools_bin,
    tmp_path / 'refract-serve.log',
    extra_args=[
      '--serve_http=false',
      '--fn_api_host',
      '127.0.0.1',
      '--sdk_python',
      sys.executable,
      '--worker_pool',
      ray_cluster.address,
    ],
  )
  processes = request.node.refract_processes = [server]
  try:
    server.wait_ready()
    started = time.monotonic()
    wait_for('a pool per node', lambda: len(live_pools(server)) == 3, POOLS_UP_S, server)
    print('3 pools up %.1fs after the server' % (time.monotonic() - started))
    # Ray Client sometimes fails to start the head's server for a new
    # client (`SpecificServer startup failed`, after 30-40 s); Refract then
    # starts its sidecar again. Shown, as it explains a slow start.
    for line in re.findall(
      r'.*(?:Ray driver reports trouble|Ray worker pools '
      r'are gone).*',
      server_log(server),
    ):
      print('  before the pools were up: %s' % line[:300])
    yield server
  finally:
    # Clients first (a failed test may leave one waiting), then the server,
    # whose sidecar stops the pools before the cluster goes.
    for process in reversed(processes):
      process.stop()


def submit(request, server, work, elements, sleep):
  job = Job(server, work, elements, sleep)
  request.node.refract_processes.append(job.client)
  return job


def wait_for(what, condition, timeout_s, server):
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert server.proc.poll() is None, 'refract serve exited'
    assert time.monotonic() < deadline, '%s: not within %ss' % (what, timeout_s)
    time.sleep(0.3)


def pools_list(server):
  """`refract pools list`: one (source, address, state, capacity, workers)
  per pool."""
  run = subprocess.run(
    [server.args[0], 'pools', 'list', '--job_endpoint', server.endpoint],
    capture_output=True,
    text=True,
    timeout=30,
    check=False,
  )
  assert run.returncode == 0, run.stdout + run.stderr
  return [tuple(line.split('\t')) for line in run.stdout.splitlines() if line.strip()]


def live_pools(server):
  return sorted(row[1] for row in pools_list(server) if len(row) >= 3 and row[2] == 'live')


def server_log(server):
  return server.log_tail(1 << 30)


def pool_nodes(server):
  """Pool address -> Ray node id, from the server's log."""
  return dict(
    re.findall(r"Ray node's worker pool is up .*?pool=(\S+) node=(\w+)", server_log(server))
  )


def worker_pools(server, since=None):
  """Worker id -> the pool the server started it on (those started after
  `since`, a time.time(), if given), from the server's log."""
  found = {}
  for line in server_log(server).splitlines():
    m = re.search(
      r'starting worker through the worker pool '
      r'worker_id="?([^" ]+)"? pool=(\S+)',
      line,
    )
    if m and (since is None or (log_time(line) or 0) >= since):
      found[m.group(1)] = m.group(2)
  return found


def log_time(line):
  """The UTC time a server log line starts with, in seconds since the
  epoch; None for other lines."""
  m = re.match(r'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z', line)
  if not m:
    return None
  head, _, frac = m.group(1).partition('.')
  stamp = (
    datetime.datetime.strptime(head, '%Y-%m-%dT%H:%M:%S')
    .replace(tzinfo=datetime.timezone.utc)
    .timestamp()
  )
  return stamp + float('0.' + (frac or '0'))


def log_lines_after(server, at, pattern):
  """(seconds after `at`, line) of the server's log lines matching
  `pattern` (a regex) logged after `at`."""
  found = []
  for line in server_log(server).splitlines():
    t = log_time(line)
    if t is not None and t >= at and re.search(pattern, line):
      found.append((round(t - at, 2), line.strip()[:400]))
  return found


def test_batch_job_runs_on_every_node(request, ray_cluster, ray_server, tmp_path):
  pools = live_pools(ray_server)
  nodes = pool_nodes(ray_server)
  # One pool per node, told apart by port: the nodes share this host's IP.
  assert sorted(nodes.get(p) for p in pools) == sorted(ray_cluster.node_ids()), (pools, nodes)

  job = submit(request, ray_server, tmp_path, BATCH_ELEMENTS, BATCH_SLEEP_S)
  state = job.finish()
  assert state == 'DONE', job.client.log_tail()
  job.assert_exact()

  started_on = worker_pools(ray_server)
  worked = {w for _, _, w in job.progress()}
  nodes_that_worked = {nodes.get(started_on.get(w)) for w in worked}
  print(
    'job DONE in %.1fs; workers started %s; elements by node %s'
    % (
      job.seconds,
      started_on,
      {
        n: sum(1 for _, _, w in job.progress() if nodes.get(started_on.get(w)) == n)
        for n in nodes_that_worked
      },
    )
  )
  # Every worker was started through a Ray pool, one per node CPU: three.
  assert len(started_on) == 3 and set(started_on.values()) <= set(pools), (started_on, pools)
  assert worked <= set(started_on), (worked, started_on)
  assert len(nodes_that_worked - {None}) >= 2, (worked, started_on, nodes)


def node_of_worker(server, worker):
  return pool_nodes(server).get(worker_pools(server).get(worker))


def test_node_killed_mid_job(request, ray_cluster, ray_server, tmp_path):
  """A worker node's raylet and processes SIGKILLed (its pool actor and
  the Beam worker it started go with them, as on a lost machine) once
  every node's worker is at work: Refract notices, replaces the worker on
  the pools left and retries its bundles, and the job ends DONE with
  exact results. How long that took is printed."""
  job = submit(request, ray_server, tmp_path, SLOW_ELEMENTS, SLOW_SLEEP_S)
  node_ids = {n.node_id: n for n in ray_cluster.workers}

  def victim_busy():
    """The worker node's worker that did an element in the last half
    second, once the job is well under way, else None."""
    entries = job.progress()
    assert job.client.proc.poll() is None, (
      'the job ended before the fault:\n' + job.client.log_tail()
    )
    if len({w for _, _, w in entries}) < 3 or len(entries) < 300:
      return None
    for t, _, worker in reversed(entries):
      if t < time.time() - 0.5:
        return None
      if node_of_worker(ray_server, worker) in node_ids:
        return worker
    return None

  victim = None
  deadline = time.monotonic() + 120
  while victim is None:
    assert time.monotonic() < deadline, 'no worker node at work within 120s'
    time.sleep(0.2)
    victim = victim_busy()
  node = node_ids[node_of_worker(ray_server, victim)]
  victim_pool = [p for p, n in pool_nodes(ray_server).items() if n == node.node_id][0]
  done_before = len(job.progress())
  killed_at = time.time()
  ray_cluster.cluster.remove_node(node, allow_graceful=False)
  killed_in = time.time() - killed_at

  state = job.finish()
  assert state == 'DONE', job.client.log_tail()
  job.assert_exact()

  entries = job.progress()
  victim_did = {i for _, i, w in entries if w == victim}
  victim_last = max(t for t, _, w in entries if w == victim)
  others_after = [(t, i) for t, i, w in entries if w != victim and t > killed_at]
  redone = [t for t, i in others_after if i in victim_did]
  gaps = [
    b - a
    for a, b in zip(
      [killed_at] + [t for t, _ in others_after], [t for t, _ in others_after], strict=False
    )
  ]
  replacements = worker_pools(ray_server, since=killed_at)
  noticed = log_lines_after(
    ray_server,
    killed_at,
    r'(?i)lost|gone|quarantin|retry|retrying|%s|%s' % (re.escape(victim), re.escape(victim_pool)),
  )
  detected = [s for s, line in noticed if victim in line]
  pool_gone = [s for s, line in noticed if "Ray node's worker pool is gone" in line]
  measured = dict(
    job_s=round(job.seconds, 1),
    elements_before_kill=done_before,
    remove_node_s=round(killed_in, 2),
    worker_loss_logged_s=detected[0] if detected else None,
    pool_removed_s=pool_gone[0] if pool_gone else None,
    victim_last_element_after_kill_s=round(victim_last - killed_at, 2),
    first_other_progress_s=round(others_after[0][0] - killed_at, 2) if others_after else None,
    longest_pause_s=round(max(gaps), 2) if gaps else None,
    first_redo_s=round(min(redone) - killed_at, 2) if redone else None,
    elements_redone=len(redone),
    elements_logged=len(entries),
    replacement_workers=replacements,
    pools_after=live_pools(ray_server),
  )
  print('MEASURED node_killed %s' % measured)
  print('server log after the kill:\n  %s' % '\n  '.join('+%.2fs %s' % x for x in noticed[:12]))
  # The victim's worker died with its node (it notices its pool actor's
  # end within a second).
  assert victim_last - killed_at < 3, measured
  # What it had not finished was done again elsewhere, promptly.
  assert redone, measured
  assert min(redone) - killed_at < RECOVERY_BOUND_S, measured
  # Its worker was replaced on a pool that is left; the node's pool is
  # gone from the list.
  assert victim_pool not in measured['pools_after'], measured
  assert len(measured['pools_after']) == 2, measured
  assert set(replacements.values()) & set(measured['pools_after']), measured


def test_node_added_mid_job(request, ray_cluster, ray_server, tmp_path):
  """A node joining the cluster while a job runs gets a pool of its own,
  which `refract pools list` shows beside the others; the running job,
  whose worker count follows its pools' capacity, starts a worker there
  (if it is still running once the pool is up), and ends DONE with exact
  results."""
  before = live_pools(ray_server)
  job = submit(request, ray_server, tmp_path, ADDED_ELEMENTS, SLOW_SLEEP_S)
  wait_for(
    'the job at work', lambda: job.progress() or job.client.proc.poll() is not None, 120, ray_server
  )
  assert job.client.proc.poll() is None, job.client.log_tail()
  joined_at = time.time()
  node = ray_cluster.cluster.add_node(**NODE)
  wait_for(
    'a pool on the new node',
    lambda: node.node_id in pool_nodes(ray_server).values(),
    60,
    ray_server,
  )
  up_s = time.time() - joined_at
  job_running_then = job.client.proc.poll() is None
  rows = pools_list(ray_server)
  new_pool = [p for p, n in pool_nodes(ray_server).items() if n == node.node_id][0]

  state = job.finish()
  assert state == 'DONE', job.client.log_tail()
  job.assert_exact()
  on_new = {w: p for w, p in worker_pools(ray_server).items() if p == new_pool}
  print(
    'MEASURED node_added %s'
    % dict(
      pool_up_after_join_s=round(up_s, 1),
      job_s=round(job.seconds, 1),
      job_still_running_when_pool_up=job_running_then,
      workers_started_on_new_pool=sorted(on_new),
      elements_done_there=sum(1 for _, _, w in job.progress() if w in on_new),
      pools_list=rows,
    )
  )
  listed = {row[1]: row for row in rows}
  assert new_pool in listed and new_pool not in before, (rows, before)
  assert listed[new_pool][2:4] == ('live', 'capacity 1'), rows
  assert sorted(live_pools(ray_server)) == sorted(before + [new_pool])
  if job_running_then:
    assert on_new, (
      'the running job started no worker on the new pool',
      worker_pools(ray_server),
      new_pool,
    )
