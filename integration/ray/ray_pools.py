"""Refract's Ray sidecar: one Beam Python SDK worker pool per Ray node.

`refract serve --worker_pool ray://HEAD:PORT` runs this file (embedded in the
binary) as

  PYTHON ray_pools.py --address ADDRESS [--poll_interval SECONDS]

Refract has no Ray client of its own; this process is its link to the
cluster. It connects with `ray.init(address=ADDRESS)` (a `ray://` Ray Client
address, a GCS `HOST:PORT` or `auto`), starts one actor per alive node,
pinned to it, each serving Beam's external worker pool
(BeamFnExternalWorkerPoolServicer) on a port open on all interfaces, and
follows nodes as they join and leave, leaving placement and failure
detection to Ray.

What Refract reads on stdout, one JSON object a line and nothing else:

  {"event": "add", "pool": "IP:PORT", "node": "<node id>", "cpus": N}
      the pool on that node is up and accepts connections from this host;
      IP is the node's NodeManagerAddress, N its CPU resource (an integer).
  {"event": "remove", "pool": "IP:PORT", "node": "<node id>"}
      that pool is gone (its node left or died, or its actor died); when the
      node is still there, a new actor is started and announced anew.
  {"event": "error", "message": "..."}
      something the user should see. After "cannot connect to Ray", or when
      following the cluster fails, the process exits with status 1.

It exits, and its actors with it, when its stdin reaches end of file (Refract
holds the pipe and closes it by stopping or dying) or on SIGTERM. stderr
carries human-readable log lines, Ray's and the actors' included.

Started as `PYTHON ray_pools.py --boot_worker DIR POOL_PID --id=...
--control_endpoint=...` (by a pool, through the script it writes), it runs
one SDK worker instead: see `boot_worker`.
"""

import argparse
import fcntl
import json
import logging
import os
import re
import select
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

BOOT_FLAG = '--boot_worker'
# Each actor's work directory (its boot script, its workers' staged files)
# in the node's temp directory, locked (flock on LOCK_FILE in it) for as long
# as the actor lives.
WORK_DIR_PREFIX = 'refract-ray-pool-'
LOCK_FILE = 'lock'
# How long connecting to Ray may take: ray.init retries an unanswering GCS
# address forever.
CONNECT_TIMEOUT_S = 60
# Pause before asking again when the Ray Client server refused to start a
# driver's server.
REFUSED_PAUSE_S = 2
# How long a new actor may take to report its port (scheduling, a fresh
# worker process, importing Beam).
STARTUP_TIMEOUT_S = 180
# How long a pool's port may stay unreachable from here before the user is
# told (a firewall, or a node IP not routable from Refract's host).
UNREACHABLE_WARNING_S = 30
# How long to wait before trying again on a node where a pool failed to start.
RETRY_AFTER_S = 30
# How long stopping (the actors' own cleanup, ray.shutdown) may take before
# the process exits regardless.
EXIT_GRACE_S = 8
# For the lines Ray forwards from the actors (and their workers) to this
# process's stderr, hence Refract's log: no terminal colours, and no
# "[repeated 3x across cluster]" folding of the same line from several nodes.
RAY_LOG_ENV = {'RAY_COLOR_PREFIX': '0', 'RAY_DEDUP_LOGS': '0'}

_LOG = logging.getLogger('ray_pools')


class Stop(Exception):
  """Raised to end the sidecar: SIGTERM, or Refract no longer reading."""


# --- the worker pool actor ---------------------------------------------------


class RefractWorkerPool:
  """The actor: Beam's worker pool on one node, serving until stopped.

  Ray runs it with `ray.remote(...)` (Ray is imported by the driver only),
  several calls at a time, so that `serve`, which returns only when the
  actor ends, can be the driver's way to learn of the actor's death.
  """

  def __init__(self, source):
    sweep_work_dirs()
    self._dir = tempfile.mkdtemp(prefix=WORK_DIR_PREFIX)
    self._lock = open(os.path.join(self._dir, LOCK_FILE), 'w')
    fcntl.flock(self._lock, fcntl.LOCK_EX)
    self._servicer = pool_servicer(write_boot_script(self._dir, source))
    self._server, self._port = serve_pool(self._servicer)
    self._stopped = threading.Event()

  def port(self):
    return self._port

  def serve(self):
    """Returns once `stop` has run; fails if the actor dies first."""
    self._stopped.wait()

  def stop(self):
    """Stops the pool's workers: Beam stops them only in an atexit hook."""
    self._server.stop(grace=1)
    self._servicer.stop_workers()
    shutil.rmtree(self._dir, ignore_errors=True)
    self._stopped.set()


def sweep_work_dirs():
  """Removes the work directories of pool actors that died without cleaning
  up (killed by Ray, or by the OOM killer): those whose lock is free. A lock,
  not a pid, tells, as a container sharing /tmp has pids of its own."""
  temp = tempfile.gettempdir()
  for name in os.listdir(temp):
    if not name.startswith(WORK_DIR_PREFIX):
      continue
    try:
      with open(os.path.join(temp, name, LOCK_FILE)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(os.path.join(temp, name), ignore_errors=True)
    except OSError:
      pass  # Alive, not ours, not locked yet, or swept meanwhile.


def write_boot_script(work_dir, source):
  """Writes this file into `work_dir`, and an executable there that runs its
  worker mode, and returns that executable's path.

  Beam's pool starts each worker as one executable given container-style
  flags; a Ray node has no copy of this file, so the driver sends its text.
  The workers are told this process's id, to end when it is gone.
  """
  script = os.path.join(work_dir, 'ray_pools.py')
  with open(script, 'w') as f:
    f.write(source)
  boot = os.path.join(work_dir, 'boot')
  with open(boot, 'w') as f:
    argv = (sys.executable, script, BOOT_FLAG, work_dir, os.getpid())
    f.write('#!/bin/sh\nexec %s "$@"\n' % ' '.join(shlex.quote(str(a)) for a in argv))
  os.chmod(boot, 0o700)
  return boot


def pool_servicer(boot):
  """Beam's pool servicer in process mode, starting workers with `boot`,
  extended to remember the workers it starts so they can be stopped."""
  from apache_beam.portability.api import beam_fn_api_pb2
  from apache_beam.runners.worker import worker_pool_main

  class Servicer(worker_pool_main.BeamFnExternalWorkerPoolServicer):
    def __init__(self):
      super().__init__(use_process=True, container_executable=boot)
      self._started = set()

    def StartWorker(self, request, context):  # pylint: disable=invalid-name
      self._started.add(request.worker_id)
      return super().StartWorker(request, context)

    def stop_workers(self):
      for worker_id in list(self._started):
        self.StopWorker(beam_fn_api_pb2.StopWorkerRequest(worker_id=worker_id), None)

  return Servicer()


def serve_pool(servicer):
  """Serves `servicer` on a free port of every interface; returns the
  server and the port.

  Not Beam's `start()`: it binds the same way but hides the servicer and
  names the pool `localhost:PORT`; the driver pairs the port with the
  node's IP instead.
  """
  from concurrent import futures

  import grpc
  from apache_beam.portability.api import beam_fn_api_pb2_grpc

  # As Beam's pool: accept any client keepalive pings, never answer them
  # with GOAWAY.
  server = grpc.server(
    futures.ThreadPoolExecutor(max_workers=8),
    options=[('grpc.http2.max_pings_without_data', 0), ('grpc.http2.max_ping_strikes', 0)],
  )
  beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(servicer, server)
  port = server.add_insecure_port('[::]:0')
  server.start()
  return server, port


# --- a worker, started by a pool ---------------------------------------------


def boot_worker(work_dir, pool_pid, argv):
  """Runs one SDK harness, as a container's boot program would.

  The pool passes Refract's endpoints as flags; Beam's harness
  (sdk_worker_main) reads its settings from environment variables, among
  them the pipeline options, which only the provision service knows, and
  loads staged files (the pickled main session) from a local directory.
  """
  flags = parse_boot_flags(argv)
  # Beam's pool pipes the worker's stdout and never reads it: a chatty
  # pipeline would block on a full pipe.
  os.dup2(2, 1)
  exit_with(pool_pid)
  semi_dir = tempfile.mkdtemp(prefix='worker-', dir=work_dir)
  os.environ.update(harness_environment(flags, semi_dir))
  from apache_beam.runners.worker import sdk_worker_main

  sdk_worker_main.main([])


def parse_boot_flags(argv):
  parser = argparse.ArgumentParser(prog='ray_pools.py ' + BOOT_FLAG)
  for name in (
    'id',
    'control_endpoint',
    'logging_endpoint',
    'provision_endpoint',
    'artifact_endpoint',
  ):
    parser.add_argument('--' + name, default='')
  flags, _ = parser.parse_known_args(argv)
  if not flags.control_endpoint:
    parser.error('--control_endpoint is required')
  return flags


def exit_with(pool_pid):
  """Ends this process when the pool actor that started it (its parent) is
  gone: Ray kills actors without running their cleanup, and an orphaned
  worker would go on holding a CPU and a connection to Refract."""

  def watch():
    while os.getppid() == pool_pid:
      time.sleep(1)
    os._exit(1)  # pylint: disable=protected-access

  threading.Thread(target=watch, name='watch-pool', daemon=True).start()


def harness_environment(flags, semi_dir):
  """The variables sdk_worker_main reads, from the flags and Refract's
  provision and artifact services."""
  env = {
    'WORKER_ID': flags.id,
    'SEMI_PERSISTENT_DIRECTORY': semi_dir,
    'CONTROL_API_SERVICE_DESCRIPTOR': descriptor(flags.control_endpoint),
    'PIPELINE_OPTIONS': '{}',
  }
  if flags.logging_endpoint:
    env['LOGGING_API_SERVICE_DESCRIPTOR'] = descriptor(flags.logging_endpoint)
  if flags.provision_endpoint:
    from google.protobuf import json_format

    info = provision_info(flags)
    env['PIPELINE_OPTIONS'] = json_format.MessageToJson(info.pipeline_options)
    env['RUNNER_CAPABILITIES'] = ' '.join(info.runner_capabilities)
    if info.status_endpoint.url:
      env['STATUS_API_SERVICE_DESCRIPTOR'] = descriptor(info.status_endpoint.url)
    fetch_staged_files(flags, info, os.path.join(semi_dir, 'staged'))
  return env


def descriptor(url):
  """An ApiServiceDescriptor in the text format the harness parses."""
  from apache_beam.portability.api import endpoints_pb2
  from google.protobuf import text_format

  return text_format.MessageToString(endpoints_pb2.ApiServiceDescriptor(url=url), as_one_line=True)


def worker_metadata(flags):
  """Refract tells workers apart by this header on every call."""
  return [('worker_id', flags.id)] if flags.id else []


def provision_info(flags):
  import grpc
  from apache_beam.portability.api import beam_provision_api_pb2
  from apache_beam.portability.api import beam_provision_api_pb2_grpc

  with grpc.insecure_channel(flags.provision_endpoint) as channel:
    stub = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel)
    try:
      return stub.GetProvisionInfo(
        beam_provision_api_pb2.GetProvisionInfoRequest(),
        metadata=worker_metadata(flags),
        timeout=60,
      ).info
    except grpc.RpcError as e:
      sys.exit('GetProvisionInfo at %s failed: %s' % (flags.provision_endpoint, e))


def fetch_staged_files(flags, info, staged_dir):
  """Downloads the artifacts to be staged into `staged_dir`, where the
  harness looks for them; installs nothing."""
  import grpc
  from apache_beam.portability import common_urns
  from apache_beam.portability.api import beam_artifact_api_pb2
  from apache_beam.portability.api import beam_artifact_api_pb2_grpc
  from apache_beam.portability.api import beam_runner_api_pb2

  os.makedirs(staged_dir, exist_ok=True)
  staging_to = common_urns.artifact_roles.STAGING_TO.urn
  wanted = [d for d in info.dependencies if d.role_urn == staging_to]
  if not wanted or not flags.artifact_endpoint:
    return
  with grpc.insecure_channel(flags.artifact_endpoint) as channel:
    stub = beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub(channel)
    for artifact in wanted:
      name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(
        artifact.role_payload
      ).staged_name
      path = os.path.join(staged_dir, os.path.basename(name))
      try:
        with open(path, 'wb') as f:
          for chunk in stub.GetArtifact(
            beam_artifact_api_pb2.GetArtifactRequest(artifact=artifact),
            metadata=worker_metadata(flags),
            timeout=300,
          ):
            f.write(chunk.data)
      except grpc.RpcError as e:
        sys.exit('fetching the staged file %s failed: %s' % (name, e))


# --- the driver: following the cluster --------------------------------------


class Events:
  """The JSON lines Refract reads.

  They go to a private copy of the original stdout, and file descriptor 1
  itself is pointed at stderr: Ray prints its actors' output to stdout, as
  may any library, and one stray line there would break Refract's reading.
  """

  def __init__(self):
    self._out = os.fdopen(os.dup(1), 'w')
    os.dup2(2, 1)

  def emit(self, event, **fields):
    try:
      self._out.write(json.dumps(dict(event=event, **fields)) + '\n')
      self._out.flush()
    except OSError as e:
      raise Stop('stdout is closed (%s)' % e) from e

  def error(self, message):
    """Reports `message`, unless Refract no longer reads."""
    _LOG.error('%s', message)
    try:
      self.emit('error', message=message)
    except Stop:
      pass


class Pool:
  """One actor, from its start on a node until it is gone."""

  def __init__(self, node, actor):
    self.node_id = node['NodeID']
    self.ip = node['NodeManagerAddress']
    self.cpus = int(node['Resources'].get('CPU', 0))
    self.actor = actor
    self.port_ref = actor.port.remote()
    self.done_ref = actor.serve.remote()
    self.started = time.monotonic()
    self.port = None
    self.port_known = None
    self.announced = False
    self.warned = False

  @property
  def address(self):
    host = '[%s]' % self.ip if ':' in self.ip else self.ip
    return '%s:%d' % (host, self.port)

  def describe(self):
    return 'node %s (%s)' % (self.node_id, self.ip)


class Pools:
  """The actors of all alive nodes, brought up to date by `poll`."""

  def __init__(self, ray, events, source):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    self._ray = ray
    self._events = events
    self._source = source
    self._actor_class = ray.remote(RefractWorkerPool)
    self._affinity = NodeAffinitySchedulingStrategy
    self._pools = {}
    # Nodes where a pool failed to start: when to try again.
    self._retry_at = {}
    # Nodes whose start failure the user has been told of, until one works.
    self._reported = set()

  def poll(self):
    alive = self._alive_nodes()
    for pool in [p for p in self._pools.values() if p.node_id not in alive]:
      self._end(pool, 'its node left the cluster')
    for node_id in [n for n in self._retry_at if n not in alive]:
      del self._retry_at[node_id]
      self._reported.discard(node_id)
    self._reap_dead()
    self._start_missing(alive)
    self._announce_ready()

  def stop(self):
    """Stops every actor: politely first, so that their workers go too."""
    pools = list(self._pools.values())
    self._pools.clear()
    if pools:
      self._ray.wait([p.actor.stop.remote() for p in pools], num_returns=len(pools), timeout=5)
    for pool in pools:
      self._kill(pool)

  def _alive_nodes(self):
    return {n['NodeID']: n for n in self._ray.nodes() if n['Alive']}

  def _start_missing(self, alive):
    now = time.monotonic()
    for node_id, node in alive.items():
      if node_id not in self._pools and self._retry_at.get(node_id, 0) <= now:
        self._start(node)

  def _start(self, node):
    actor = self._actor_class.options(
      num_cpus=0,
      max_concurrency=4,
      scheduling_strategy=self._affinity(node['NodeID'], soft=False),
    ).remote(self._source)
    pool = Pool(node, actor)
    self._pools[pool.node_id] = pool
    _LOG.info('starting a worker pool on %s', pool.describe())

  def _reap_dead(self):
    """Handles actors whose `serve` call ended: they died (Ray says so when
    their process or node is gone) or could not start."""
    refs = {p.done_ref: p for p in self._pools.values()}
    if not refs:
      return
    ended, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=0)
    for ref in ended:
      pool = refs[ref]
      why = self._failure(ref)
      if pool.announced:
        self._end(pool, 'its actor died: %s' % why)
      else:
        self._failed(pool, why)

  def _failure(self, ref):
    try:
      self._ray.get(ref)
      return 'the actor stopped'
    except Exception as e:  # pylint: disable=broad-except
      _LOG.debug('actor failure', exc_info=True)
      return summary(e)

  def _announce_ready(self):
    for pool in [p for p in self._pools.values() if not p.announced]:
      if pool.port is None:
        self._learn_port(pool)
      elif accepts_connections(pool.ip, pool.port):
        pool.announced = True
        self._reported.discard(pool.node_id)
        _LOG.info('worker pool %s up on %s, %d CPUs', pool.address, pool.describe(), pool.cpus)
        self._events.emit('add', pool=pool.address, node=pool.node_id, cpus=pool.cpus)
      elif not pool.warned and time.monotonic() - pool.port_known > UNREACHABLE_WARNING_S:
        pool.warned = True
        self._events.error(
          'the worker pool on %s listens at %s, which does not accept '
          'connections from this host; still trying' % (pool.describe(), pool.address)
        )

  def _learn_port(self, pool):
    ready, _ = self._ray.wait([pool.port_ref], timeout=0)
    if ready:
      try:
        pool.port = self._ray.get(pool.port_ref)
        pool.port_known = time.monotonic()
      except Exception:  # pylint: disable=broad-except
        pass  # The actor died: `_reap_dead` tells why.
    elif time.monotonic() - pool.started > STARTUP_TIMEOUT_S:
      self._failed(pool, 'not up within %ds' % STARTUP_TIMEOUT_S)

  def _failed(self, pool, why):
    """A pool that never came up: tells the user (once per node, and not
    when the node itself has gone meanwhile) and waits before a retry."""
    self._pools.pop(pool.node_id, None)
    self._kill(pool)
    if pool.node_id not in self._alive_nodes():
      _LOG.info('the worker pool on %s ended with its node: %s', pool.describe(), why)
      return
    self._retry_at[pool.node_id] = time.monotonic() + RETRY_AFTER_S
    message = 'cannot start a worker pool on %s: %s' % (pool.describe(), why)
    if pool.node_id in self._reported:
      _LOG.warning('%s', message)
    else:
      self._reported.add(pool.node_id)
      self._events.error(message)

  def _end(self, pool, why):
    self._pools.pop(pool.node_id, None)
    self._kill(pool)
    if pool.announced:
      _LOG.info('worker pool %s on %s removed: %s', pool.address, pool.describe(), why)
      self._events.emit('remove', pool=pool.address, node=pool.node_id)
    else:
      _LOG.info('worker pool starting on %s dropped: %s', pool.describe(), why)

  def _kill(self, pool):
    try:
      self._ray.kill(pool.actor)
    except Exception as e:  # pylint: disable=broad-except
      _LOG.debug('killing the actor on %s: %s', pool.describe(), e)


def summary(error):
  """The first and last lines of `error`, without terminal colours: Ray's
  errors put where the actor died first and the exception raised (say, a
  missing apache_beam on the node) last, with a traceback in between."""
  lines = [
    line.strip() for line in re.sub(r'\x1b\[[0-9;]*m', '', str(error)).splitlines() if line.strip()
  ]
  if not lines:
    return repr(error)
  return lines[0] if len(lines) == 1 else '%s: %s' % (lines[0], lines[-1])


def accepts_connections(ip, port):
  try:
    socket.create_connection((ip, port), timeout=1).close()
    return True
  except OSError:
    return False


def unreachable(address):
  """Why `address` cannot be Ray's, when a TCP probe shows it, else None:
  ray.init retries a dead GCS address forever and gives up on a Ray
  Client one only after 30 s."""
  host_port = address[len('ray://') :] if address.startswith('ray://') else (address)
  host, sep, port = host_port.rpartition(':')
  if not sep or not port.isdigit():
    return None  # `auto`, or a form left to Ray.
  host = host.strip('[]')
  try:
    socket.create_connection((host, int(port)), timeout=10).close()
    return None
  except OSError as e:
    return 'nothing answers at %s (%s)' % (host_port, e)


def connect(address, events):
  """Connects to Ray, within CONNECT_TIMEOUT_S; returns the `ray` module."""
  problem = unreachable(address)
  if problem:
    raise ConnectionError(problem)
  # Read here in a GCS-address driver; by the Ray Client server's driver
  # process through the job's runtime environment.
  for name, value in RAY_LOG_ENV.items():
    os.environ.setdefault(name, value)
  use_token_if_present()
  import ray

  timer = threading.Timer(CONNECT_TIMEOUT_S, give_up_connecting, args=(address, events))
  timer.daemon = True
  timer.start()
  deadline = time.monotonic() + CONNECT_TIMEOUT_S - REFUSED_PAUSE_S
  try:
    while True:
      try:
        ray.init(address=address, log_to_driver=True, runtime_env={'env_vars': RAY_LOG_ENV})
        break
      except ConnectionAbortedError as e:
        # The Ray Client server answered but could not start this driver's
        # server (a head still coming up, its runtime-env agent not ready
        # yet): it may well succeed a moment later. The client has
        # disconnected itself.
        if time.monotonic() >= deadline:
          raise
        _LOG.warning('Ray refused the connection for now, trying again: %s', str(e).splitlines()[0])
        time.sleep(REFUSED_PAUSE_S)
  finally:
    timer.cancel()
  return ray


def use_token_if_present():
  """Sends Ray's authentication token when there is one: `ray start`
  turns token authentication on when it finds a token, but a Ray Client
  only sends it when RAY_AUTH_MODE says so, and is refused without it."""
  if 'RAY_AUTH_MODE' in os.environ:
    return
  path = os.environ.get('RAY_AUTH_TOKEN_PATH') or os.path.join(
    os.path.expanduser('~'), '.ray', 'auth_token'
  )
  if os.environ.get('RAY_AUTH_TOKEN') or os.path.isfile(path):
    os.environ['RAY_AUTH_MODE'] = 'token'


def give_up_connecting(address, events):
  """Ends the process from the timer thread: ray.init cannot be
  interrupted."""
  events.error('cannot connect to Ray at %s: no answer within %ds' % (address, CONNECT_TIMEOUT_S))
  os._exit(1)  # pylint: disable=protected-access


def follow(pools, poll_interval):
  """Polls the cluster every `poll_interval` seconds until stdin's end."""
  while True:
    pools.poll()
    readable, _, _ = select.select([0], [], [], poll_interval)
    if readable and not os.read(0, 65536):
      _LOG.info('stdin closed: stopping')
      return


def exit_soon(code):
  """Ends the process EXIT_GRACE_S from now if stopping hangs (a Ray call
  to an unanswering cluster)."""
  # pylint: disable-next=protected-access
  timer = threading.Timer(EXIT_GRACE_S, os._exit, args=(code,))
  timer.daemon = True
  timer.start()


def raise_stop(signum, unused_frame):
  raise Stop('signal %d' % signum)


def run_sidecar(args):
  events = Events()
  signal.signal(signal.SIGTERM, raise_stop)
  try:
    ray = connect(args.address, events)
  except (Stop, KeyboardInterrupt):
    return 0
  except Exception as e:  # pylint: disable=broad-except
    events.error('cannot connect to Ray at %s: %s' % (args.address, e))
    return 1
  # Again: ray.init installs a SIGTERM handler of its own, which dies with
  # a stack trace and leaves the actors to Ray's owner-death cleanup.
  signal.signal(signal.SIGTERM, raise_stop)
  with open(os.path.abspath(__file__)) as f:
    pools = Pools(ray, events, f.read())
  code = 0
  try:
    follow(pools, args.poll_interval)
  except (Stop, KeyboardInterrupt) as e:
    _LOG.info('stopping: %s', e or 'interrupted')
  except Exception as e:  # pylint: disable=broad-except
    _LOG.exception('following the Ray cluster failed')
    events.error('following the Ray cluster failed: %s' % e)
    code = 1
  exit_soon(code)
  try:
    pools.stop()
    ray.shutdown()
  except (Stop, KeyboardInterrupt):
    pass
  return code


def parse_args(argv):
  parser = argparse.ArgumentParser(description='Refract sidecar: Beam worker pools on Ray nodes.')
  parser.add_argument(
    '--address', required=True, help='Ray address for ray.init: ray://HOST:PORT, HOST:PORT or auto'
  )
  parser.add_argument(
    '--poll_interval', type=float, default=2.0, help='seconds between looks at the cluster'
  )
  return parser.parse_args(argv)


def setup_logging():
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(logging.Formatter('ray_pools %(levelname)s %(message)s'))
  _LOG.addHandler(handler)
  _LOG.setLevel(logging.INFO)
  _LOG.propagate = False


def main(argv):
  setup_logging()
  if len(argv) > 3 and argv[1] == BOOT_FLAG:
    boot_worker(argv[2], int(argv[3]), argv[4:])
    return 0
  return run_sidecar(parse_args(argv[1:]))


if __name__ == '__main__':
  sys.exit(main(sys.argv))
