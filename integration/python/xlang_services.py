"""Services for Refract's cross-language tests, as context managers.

  java_expansion_service()    Beam's Java expansion service (KafkaIO,
                              GenerateSequence, ...) with its loopback worker
                              pool: yields 'localhost:PORT'
  python_expansion_service()  Python's test expansion service with its
                              worker pool: yields 'localhost:PORT'
  kafka_broker(tmp_dir)       a one-node Kafka broker (KRaft, broker and
                              controller in one JVM): yields the bootstrap
                              address 'localhost:PORT'
  prism_job_server()          Prism, Beam's Go runner, as a job service:
                              yields its job endpoint 'localhost:PORT'

Each one starts its process in a session of its own on free ports, waits
until a client gets an answer from it, and at exit ends its whole process
group (and removes the broker's data). The Java classpaths and the Prism
binary come from integration/common.sh (refract_xlang_classpath,
refract_kafka_classpath, refract_prism_bin), which resolve them once into
~/.cache/refract.

Loopback only: every address handed out is localhost. The Java expansion
service and Prism bind their ports on all interfaces (neither has an option
to bind one address); nothing but this machine talks to them.
"""

import base64
import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import grpc
from apache_beam.portability.api import beam_expansion_api_pb2
from apache_beam.portability.api import beam_expansion_api_pb2_grpc
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.portability.api import beam_job_api_pb2_grpc

from refract_testlib import RefractProcess
from refract_testlib import accepts
from refract_testlib import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
COMMON_SH = os.path.join(REPO, 'integration', 'common.sh')

JAVA_EXPANSION_SERVICE_MAIN = 'org.apache.beam.sdk.expansion.service.ExpansionService'
STARTUP_TIMEOUT_S = 120
# The broker's heap: Kafka's own start script asks for 1 GiB; a test broker
# holding a few thousand records needs far less, and CI shares 24 GiB.
KAFKA_HEAP = '-Xmx512m'


@functools.lru_cache(maxsize=None)
def common_sh(function):
  """The output of a function of integration/common.sh (a classpath or a
  binary's path), computed once per test process. Its progress messages
  (Maven, go build) go to this process's stderr."""
  run = subprocess.run(
    ['bash', '-c', '. "$1" && ' + function, 'common.sh', COMMON_SH],
    stdout=subprocess.PIPE,
    stdin=subprocess.DEVNULL,
    text=True,
    check=False,
  )
  if run.returncode != 0:
    raise RuntimeError('integration/common.sh %s failed (exit %d)' % (function, run.returncode))
  return run.stdout.strip()


class ServiceProcess(RefractProcess):
  """A service process started in a new session with its output in a log
  file, which can say when it is ready."""

  def __init__(self, name, args, log_path, cwd=None):
    self.name = name
    self.started = time.monotonic()
    super().__init__(args, log_path, cwd=cwd)
    # The command line as reports show it (conftest.py puts it above a
    # failing test's log tail), with classpaths abbreviated.
    self.args = [
      '<classpath>' if i and self.args[i - 1] == '-cp' else a for i, a in enumerate(self.args)
    ]

  def check_alive(self):
    if self.proc.poll() is not None:
      raise RuntimeError(
        '%s exited with code %s; log %s:\n%s'
        % (self.name, self.proc.returncode, self.log_path, self.log_tail())
      )

  def wait_until(self, probe, timeout_s=STARTUP_TIMEOUT_S, every_s=0.2):
    """Calls probe() until it returns true, failing if the process exits
    or `timeout_s` passes; returns the seconds since the process started."""
    deadline = time.monotonic() + timeout_s
    while True:
      self.check_alive()
      if probe():
        return time.monotonic() - self.started
      if time.monotonic() > deadline:
        raise RuntimeError(
          '%s was not ready within %ss; log %s:\n%s'
          % (self.name, timeout_s, self.log_path, self.log_tail())
        )
      time.sleep(every_s)


def _grpc_answers(endpoint, call):
  """A probe: true once `call(channel)` gets any answer but UNAVAILABLE or
  a deadline (an error status such as UNIMPLEMENTED is an answer too)."""

  def probe():
    with grpc.insecure_channel(endpoint) as channel:
      try:
        call(channel)
      except grpc.RpcError as e:
        if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
          return False
      return True

  return probe


def _expansion_service_answers(endpoint):
  return _grpc_answers(
    endpoint,
    lambda channel: beam_expansion_api_pb2_grpc.ExpansionServiceStub(
      channel
    ).DiscoverSchemaTransform(beam_expansion_api_pb2.DiscoverSchemaTransformRequest(), timeout=5),
  )


@contextlib.contextmanager
def _running(service, probe, timeout_s=STARTUP_TIMEOUT_S):
  try:
    service.ready_s = service.wait_until(probe, timeout_s)
    yield service
  finally:
    service.stop()


def _log_path(log_dir, name):
  if log_dir is None:
    return os.devnull
  os.makedirs(str(log_dir), exist_ok=True)
  return os.path.join(str(log_dir), name)


@contextlib.contextmanager
def _expansion_service(name, argv, port, log_dir, process):
  """Runs expansion service `name` (`argv`, listening on `port`) until the
  context ends: yields 'localhost:PORT'. `process`, a list, receives the
  ServiceProcess, for logs and timings."""
  log_name = name.lower().replace(' ', '-') + '.log'
  service = ServiceProcess(name, argv, _log_path(log_dir, log_name))
  if process is not None:
    process.append(service)
  endpoint = 'localhost:%d' % port
  with _running(service, _expansion_service_answers(endpoint)):
    yield endpoint


@contextlib.contextmanager
def java_expansion_service(log_dir=None, process=None):
  """Beam's Java expansion service (classpath: refract_xlang_classpath) with
  --alsoStartLoopbackWorker, on a free port: yields 'localhost:PORT'.

  Its expansions come back in a beam:env:anyof:v1 environment with two
  choices: DOCKER (apache/beam_java17_sdk) and EXTERNAL at this same port,
  where the service's worker pool starts Java SDK harnesses as threads of
  its own JVM (after asking the runner's provision service for the
  pipeline options)."""
  port = free_port()
  argv = [
    'java',
    '-cp',
    common_sh('refract_xlang_classpath'),
    JAVA_EXPANSION_SERVICE_MAIN,
    port,
    '--alsoStartLoopbackWorker',
  ]
  with _expansion_service('Java expansion service', argv, port, log_dir, process) as endpoint:
    yield endpoint


@contextlib.contextmanager
def python_expansion_service(log_dir=None, process=None):
  """Python's test expansion service (python_expansion_service.py: Beam's
  `beam:transforms:xlang:test:*` transforms and a worker pool in its own
  process, on loopback), on a free port: yields 'localhost:PORT'."""
  port = free_port()
  argv = [sys.executable, os.path.join(HERE, 'python_expansion_service.py'), port]
  with _expansion_service('Python expansion service', argv, port, log_dir, process) as endpoint:
    yield endpoint


@contextlib.contextmanager
def prism_job_server(log_dir=None, process=None):
  """Prism (binary: refract_prism_bin) as a job service on a free port, its
  web UI off: yields the job endpoint 'localhost:PORT', for
  --runner=PortableRunner --job_endpoint=..."""
  port = free_port()
  service = ServiceProcess(
    'Prism',
    [common_sh('refract_prism_bin'), '-job_port', port, '-serve_http=false', '-log_level', 'warn'],
    _log_path(log_dir, 'prism.log'),
  )
  if process is not None:
    process.append(service)
  endpoint = 'localhost:%d' % port
  probe = _grpc_answers(
    endpoint,
    lambda channel: beam_job_api_pb2_grpc.JobServiceStub(channel).GetState(
      beam_job_api_pb2.GetJobStateRequest(job_id='[probe]'), timeout=5
    ),
  )
  with _running(service, probe):
    yield endpoint


def _kafka_cluster_id():
  # What `kafka-storage random-uuid` prints: 16 random bytes, base64url
  # without padding, and (as Kafka's own generator does) never starting
  # with '-', which the storage tool would read as a flag (one run in 64).
  # Made here to save starting a JVM for it.
  while True:
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b'=').decode()
    if not cluster_id.startswith('-'):
      return cluster_id


def _kafka_properties(data_dir, broker_port, controller_port):
  return '\n'.join(
    [
      # KRaft combined mode: this one process is the whole cluster, broker
      # and its own controller quorum.
      'process.roles=broker,controller',
      'node.id=1',
      'controller.quorum.voters=1@127.0.0.1:%d' % controller_port,
      'controller.listener.names=CONTROLLER',
      'listeners=PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d'
      % (broker_port, controller_port),
      'advertised.listeners=PLAINTEXT://127.0.0.1:%d' % broker_port,
      'listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT',
      'inter.broker.listener.name=PLAINTEXT',
      'log.dirs=%s' % data_dir,
      # Internal topics default to 3 replicas, which one broker cannot
      # hold: consumer groups and transactions would never start.
      'offsets.topic.replication.factor=1',
      'transaction.state.log.replication.factor=1',
      'transaction.state.log.min.isr=1',
      'share.coordinator.state.topic.replication.factor=1',
      'share.coordinator.state.topic.min.isr=1',
      # A consumer group's first member starts at once instead of 3 s on.
      'group.initial.rebalance.delay.ms=0',
      'num.partitions=1',
      # Keep every record: retention goes by record timestamps, and tests
      # that set fixed event times in the past (test_kafka_exactly_once)
      # would otherwise see the broker delete their input within minutes.
      'log.retention.ms=-1',
      'auto.create.topics.enable=true',
      '',
    ]
  )


def _kafka_answers(bootstrap):
  host, port = bootstrap.rsplit(':', 1)

  def probe():
    # The client logs every refused connection as an error: wait for the
    # port first, quietly.
    if not accepts(int(port), host):
      return False
    # Imported here so that modules using only the expansion services do
    # not need kafka-python.
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaConfigurationError, KafkaError

    try:
      admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    except KafkaConfigurationError:
      raise  # a mistake of ours, not a broker still starting
    except (KafkaError, OSError):
      return False
    try:
      admin.list_topics()
      # A cluster whose broker is still fenced answers metadata requests
      # with no brokers; a producer would then wait.
      return bool(admin.describe_cluster().get('brokers'))
    except (KafkaError, OSError):
      return False
    finally:
      admin.close()

  return probe


@contextlib.contextmanager
def kafka_broker(tmp_dir, process=None):
  """A one-node Kafka broker (classpath: refract_kafka_classpath) on free
  loopback ports, its log and data in a new directory under `tmp_dir`:
  yields the bootstrap address 'localhost:PORT'. At exit the broker is
  stopped and its data directory removed (its log is kept)."""
  work = tempfile.mkdtemp(prefix='kafka-', dir=str(tmp_dir))
  data_dir = os.path.join(work, 'data')
  try:
    classpath = common_sh('refract_kafka_classpath')
    broker_port, controller_port = free_port(), free_port()
    while controller_port == broker_port:
      controller_port = free_port()
    config = os.path.join(work, 'server.properties')
    with open(config, 'w') as f:
      f.write(_kafka_properties(data_dir, broker_port, controller_port))
    fmt = subprocess.run(
      [
        'java',
        '-cp',
        classpath,
        'kafka.tools.StorageTool',
        'format',
        '-t',
        _kafka_cluster_id(),
        '-c',
        config,
      ],
      stdin=subprocess.DEVNULL,
      capture_output=True,
      text=True,
      check=False,
    )
    if fmt.returncode != 0:
      raise RuntimeError(
        'kafka StorageTool format failed (exit %d):\n%s%s'
        % (fmt.returncode, fmt.stdout, fmt.stderr)
      )
    service = ServiceProcess(
      'Kafka broker',
      ['java', KAFKA_HEAP, '-cp', classpath, 'kafka.Kafka', config],
      os.path.join(work, 'broker.log'),
      cwd=work,
    )
    if process is not None:
      process.append(service)
    bootstrap = 'localhost:%d' % broker_port
    with _running(service, _kafka_answers(bootstrap)):
      yield bootstrap
  finally:
    shutil.rmtree(data_dir, ignore_errors=True)
