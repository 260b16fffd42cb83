"""Remote SDK worker pools, end to end, on virtual hosts (netns_hosts.py).

`refract serve --worker_pool [SDK=]HOST:PORT ...` starts a job's SDK
workers on worker pools on other hosts (StartWorker of Beam's
BeamFnExternalWorkerPool service) and must survive losing one. Here three
network namespaces play the hosts: `runner` holds the server and the
clients that submit pipelines (no server, pool or client runs in the root
namespace), `h1` and `h2` each a Python pool (Beam's worker_pool_main, its
workers booted by integration/python_boot.sh, which fetches the job's
staged files from the runner: Refract must not rely on the shared
filesystem for artifacts) and, for the first test, a Java pool
(integration/java's ProcessWorkerPool, which runs each worker as a JVM of
its own; Beam's ExternalWorkerService, threads sharing one executor that
the first worker to end shuts down, cannot outlive a lost worker). The
filesystem is shared, which the tests use for pipeline input and output
only.

  test_same_results_locally_and_on_remote_pools[NAME]
      six pipelines (word count, a GroupByKey over many keys, a
      CombinePerKey, a stateful DoFn, a windowed streaming aggregation fed
      by a TestStream, Java's GroupByKey) give the same results with local
      workers (plain `refract serve`) and on pools in h1 and h2, every
      Python worker having run in h1 or h2;
  test_host_killed_mid_job          h1's pool and workers SIGKILLed (with
                                    the pools' capacity of workers, and
                                    with 8: four on h1);
  test_host_cut_off_mid_job         h1's link pulled (connections hang);
  test_runner_killed_and_restarted  `kill -9` of a `--state_dir` server
                                    running recovery_pipeline.py (PROCESS
                                    environment) on unlabelled pools,
                                    started again with the same flags;
  test_pool_added_mid_job           `refract pools add` on a running server:
                                    the new pool gets StartWorker calls;
  test_refract_worker_pool_runs_go_and_python_workers
                                    `refract worker-pool` running Go's boot
                                    program in h1 and python_boot.sh in h2:
                                    the Go and the Python word counts run
                                    their workers there;
each ending DONE with exact results. The fault tests on h1 run a pipeline
whose slow step logs each element with the host and process that handled
it, so a test acts once both hosts are at work and measures how long after
the fault h1's unfinished elements were done again elsewhere; h1's workers
must be replaced on h2. Measurements are printed, and appended as JSON
lines to $REFRACT_POOLS_REPORT when set.

This file is also the pipelines' script (`python test_remote_pools.py
pipeline NAME ...`): run as __main__, its DoFns travel to the workers by
value, with nothing to import on the pool hosts but Beam.
"""

import argparse
import collections
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_stream as beam_test_stream
from apache_beam.transforms import trigger
from apache_beam.transforms import userstate
from apache_beam.transforms import window

import refract_testlib

HERE = os.path.dirname(os.path.abspath(__file__))
INTEGRATION = os.path.dirname(HERE)
BOOT = os.path.join(INTEGRATION, 'python_boot.sh')
JAVA_PROJECT = os.path.join(INTEGRATION, 'java')
PYTHON = sys.executable
BUCKETS = 8

# ---------------------------------------------------------------------------
# The pipelines (run in the runner's namespace by `main()` below).
# ---------------------------------------------------------------------------


def where():
  """This process's host and pid, as `NETNS-INODE-PID`: the test maps the
  inode of a network namespace to the host it is."""
  return '%d-%d' % (os.stat('/proc/self/ns/net').st_ino, os.getpid())


class WriteBucket(beam.DoFn):
  """Writes one bucket's lines, sorted, to OUTPUT/part-B.txt (a temporary
  file renamed over it, so a retried bundle writes the same file again),
  and leaves a mark in OUTPUT.where/ naming the host and process."""

  def __init__(self, output):
    self.output = output

  def process(self, kv):
    bucket, lines = kv
    os.makedirs(self.output, exist_ok=True)
    os.makedirs(self.output + '.where', exist_ok=True)
    path = os.path.join(self.output, 'part-%d.txt' % bucket)
    tmp = '%s.%s.tmp' % (path, where())
    with open(tmp, 'w') as f:
      f.write(''.join(line + '\n' for line in sorted(lines)))
    os.replace(tmp, path)
    open(os.path.join(self.output + '.where', where()), 'w').close()


def write_lines(lines, output):
  """The pipelines' sink: lines spread over BUCKETS files by a hash that is
  the same in every process (Python's own hash() is salted per process),
  each written once the input is complete (AfterWatermark in the global
  window: what the default trigger does, which Beam refuses to group an
  unbounded PCollection by)."""
  return (
    lines
    | 'Global'
    >> beam.WindowInto(
      window.GlobalWindows(),
      trigger=trigger.AfterWatermark(),
      accumulation_mode=trigger.AccumulationMode.DISCARDING,
    )
    | 'Bucket' >> beam.Map(lambda line: (zlib.crc32(line.encode()) % BUCKETS, line))
    | 'ByBucket' >> beam.GroupByKey()
    | 'Write' >> beam.ParDo(WriteBucket(output))
  )


class CountAndSum(beam.DoFn):
  """Per key and window: a count and a sum in user state, emitted from an
  event-time timer at the window's end (a number applied twice or lost
  would show)."""

  COUNT = userstate.ReadModifyWriteStateSpec('count', VarIntCoder())
  TOTAL = userstate.ReadModifyWriteStateSpec('total', VarIntCoder())
  END = userstate.TimerSpec('end', userstate.TimeDomain.WATERMARK)

  def process(
    self,
    kv,
    w=beam.DoFn.WindowParam,
    count=beam.DoFn.StateParam(COUNT),
    total=beam.DoFn.StateParam(TOTAL),
    end=beam.DoFn.TimerParam(END),
  ):
    count.write((count.read() or 0) + 1)
    total.write((total.read() or 0) + kv[1])
    end.set(w.max_timestamp())

  @userstate.on_timer(END)
  def emit(
    self,
    key=beam.DoFn.KeyParam,
    count=beam.DoFn.StateParam(COUNT),
    total=beam.DoFn.StateParam(TOTAL),
  ):
    yield '%s %d %d' % (key, count.read() or 0, total.read() or 0)


class SlowTouch(beam.DoFn):
  """Sleeps `sleep` seconds per element and logs `ELEMENT TIME` to
  PROGRESS/NETNS-INODE-PID.log, flushed at once: the fault tests read
  which host did what when."""

  def __init__(self, progress, sleep):
    self.progress = progress
    self.sleep = sleep
    self.log = None

  def setup(self):
    os.makedirs(self.progress, exist_ok=True)
    self.log = open(os.path.join(self.progress, where() + '.log'), 'a', buffering=1)

  def process(self, i):
    time.sleep(self.sleep)
    self.log.write('%d %.6f\n' % (i, time.time()))
    yield i


def wordcount(p, args):
  return (
    p
    | beam.io.ReadFromText(args.input)
    | 'Words' >> beam.FlatMap(lambda line: re.findall(r'[a-z]+', line))
    | 'One' >> beam.Map(lambda w: (w, 1))
    | 'Count' >> beam.CombinePerKey(sum)
    | 'Format' >> beam.MapTuple(lambda w, n: '%s %d' % (w, n))
  )


def gbk(p, args):
  def describe(k, values):
    values = list(values)
    return '%d %d %d %d %d' % (k, len(values), sum(values), min(values), max(values))

  return (
    p
    | beam.Create(list(range(args.elements)))
    | beam.Reshuffle()
    | 'Key' >> beam.Map(lambda i: (i % args.keys, i))
    | beam.GroupByKey()
    | 'Describe' >> beam.MapTuple(describe)
  )


def combine(p, args):
  class Stats(beam.CombineFn):
    def create_accumulator(self):
      return (0, 0, 0)

    def add_input(self, acc, x):
      return (acc[0] + 1, acc[1] + x, acc[2] + x * x)

    def merge_accumulators(self, accs):
      return tuple(sum(a[i] for a in accs) for i in range(3))

    def extract_output(self, acc):
      return acc

  return (
    p
    | beam.Create(list(range(args.elements)))
    | 'Key' >> beam.Map(lambda i: (i % args.keys, i))
    | beam.CombinePerKey(Stats())
    | 'Format' >> beam.MapTuple(lambda k, s: '%d %d %d %d' % ((k,) + s))
  )


def stateful(p, args):
  return (
    p
    | beam.Create(list(range(args.elements)))
    | beam.Reshuffle()
    | 'Key' >> beam.Map(lambda i: (i % args.keys, i))
    | 'CountAndSum' >> beam.ParDo(CountAndSum())
  )


def stream_events(windows=6, per_window=100, keys=5):
  """The windowed pipeline's input: `per_window` numbered elements in each
  10 s window, the watermark moved past each window after its elements."""
  tv = window.TimestampedValue
  stream = beam_test_stream.TestStream()
  for w in range(windows):
    stream = stream.add_elements(
      [
        tv(('k%d' % (i % keys), i), w * 10 + (i % 10))
        for i in range(w * per_window, (w + 1) * per_window)
      ]
    ).advance_watermark_to(w * 10 + 10)
  return stream.advance_watermark_to_infinity()


def windowed(p, args):
  del args

  def format_window(kv, w=beam.DoFn.WindowParam):
    return '%d %s %d' % (int(w.start), kv[0], kv[1])

  return (
    p
    | stream_events()
    | beam.WindowInto(window.FixedWindows(10))
    | 'Sum' >> beam.CombinePerKey(sum)
    | 'Format' >> beam.Map(format_window)
  )


def slow(p, args):
  return (
    p
    | beam.Create(list(range(args.elements)))
    | beam.Reshuffle()
    | 'Slow' >> beam.ParDo(SlowTouch(args.output + '.progress', args.sleep))
    | 'Key' >> beam.Map(lambda i: (i % args.keys, i))
    | 'CountAndSum' >> beam.ParDo(CountAndSum())
  )


PIPELINES = {
  'wordcount': wordcount,
  'gbk': gbk,
  'combine': combine,
  'stateful': stateful,
  'windowed': windowed,
  'slow': slow,
}
STREAMING = {'windowed'}


def main(argv):
  """`pipeline NAME --job_endpoint E --output DIR [...]`: submits pipeline
  NAME; prints `JOB_ID id`, then (with --wait) `FINAL_STATE state`,
  exiting 0 only if it is DONE."""
  parser = argparse.ArgumentParser()
  parser.add_argument('command', choices=['pipeline'])
  parser.add_argument('name', choices=sorted(PIPELINES))
  parser.add_argument('--job_endpoint', required=True)
  parser.add_argument('--output', required=True)
  parser.add_argument('--input')
  parser.add_argument('--elements', type=int, default=20000)
  parser.add_argument('--keys', type=int, default=50)
  parser.add_argument('--sleep', type=float, default=0.04)
  parser.add_argument('--wait', action='store_true')
  args, beam_args = parser.parse_known_args(argv)
  flags = ['--runner=PortableRunner', '--job_endpoint=' + args.job_endpoint]
  if args.name in STREAMING:
    flags.append('--streaming')
  if not any(a.startswith('--sdk_worker_parallelism') for a in beam_args):
    # Python's default is 1 worker; 0 leaves it to the runner: the pools'
    # capacity, one per core locally.
    flags.append('--sdk_worker_parallelism=0')
  # No --environment_type: Python's default, DOCKER, naming Beam's image
  # apache/beam_python3.11_sdk:<version>, which pools labelled `python`
  # serve (and a server without pools runs as a local process).
  p = beam.Pipeline(options=PipelineOptions(flags + beam_args))
  write_lines(PIPELINES[args.name](p, args), args.output)
  result = p.run()
  print('JOB_ID', result._job_id, flush=True)  # pylint: disable=protected-access
  if not args.wait:
    return 0
  state = result.wait_until_finish()
  print('FINAL_STATE', state, flush=True)
  return 0 if state == 'DONE' else 1


if __name__ == '__main__':
  refract_testlib.exit_now(main(sys.argv[1:]))

# ---------------------------------------------------------------------------
# The tests.
# ---------------------------------------------------------------------------

# Imported here, not at the top: run as the pipelines' script (above),
# the file exits before needing them.
# pylint: disable=wrong-import-position
import pytest  # noqa: E402

import netns_hosts  # noqa: E402

AVAILABLE, WHY_NOT = netns_hosts.available()
# Longer than the suite's default per test: a module's first test also
# builds integration/java and starts the pools.
pytestmark = [
  pytest.mark.skipif(not AVAILABLE, reason='virtual hosts unavailable: %s' % WHY_NOT),
  pytest.mark.timeout(600),
]

JOB_PORT = 8099
PY_POOL_PORT = 50100
JAVA_POOL_PORT = 50200
PIPELINE_TIMEOUT_S = 300
LIVENESS_BOUND_S = 15  # a lost host must be noticed within this
GROW_S = 10  # a running job must start workers on an added pool within this
PYTHON_POOL_MAIN = 'apache_beam.runners.worker.worker_pool_main'
JAVA_POOL_MAIN = 'org.refract.examples.ProcessWorkerPool'
JAVA_BENCH_MAIN = 'org.refract.bench.JavaBench'
# The fault tests' pipeline: about 80 s of sleeping in the slow step,
# shared by the workers.
SLOW_ELEMENTS = 2000
SLOW_SLEEP_S = 0.04
SLOW_KEYS = 13
RECOVERY_PIPELINE = os.path.join(HERE, 'recovery_pipeline.py')
RECOVERY_EVENTS = 1200
RECOVERY_PAUSE_S = 0.1


def report(test, **values):
  """Prints a measurement and appends it to $REFRACT_POOLS_REPORT."""
  line = json.dumps(dict(test=test, **values), sort_keys=True)
  print('MEASURED', line)
  path = os.environ.get('REFRACT_POOLS_REPORT')
  if path:
    with open(path, 'a') as f:
      f.write(line + '\n')


class Logged:
  """A process started in a host, as conftest.py's report hook wants it:
  its command line and the tail of its log."""

  def __init__(self, host, proc, log_path, what):
    self.host = host
    self.proc = proc
    self.log_path = str(log_path)
    self.args = ['[%s] %s' % (host.name, what)]

  def log_tail(self, max_chars=6000):
    return refract_testlib.read_log_tail(self.log_path, max_chars)

  def log_text(self):
    return self.log_tail(1 << 30)


def host_env():
  """The environment of processes started in the hosts: the venv first on
  PATH (Beam's Python pool starts workers as plain `python`)."""
  env = dict(os.environ)
  env['PATH'] = os.path.dirname(PYTHON) + os.pathsep + env.get('PATH', '')
  env.pop('PIPELINE_OPTIONS', None)
  return env


def java_classpath():
  """integration/java's classpath (built by integration/common.sh with
  Maven when needed): the Java pipelines, the pool, Beam's harness."""
  import xlang_services  # pylint: disable=import-outside-toplevel

  return xlang_services.common_sh('refract_java_classpath')


@pytest.fixture(scope='module')
def pools_bin():
  """REFRACT_BIN, which must know the flags under test."""
  path = os.environ.get('REFRACT_BIN')
  if not path:
    pytest.fail('set REFRACT_BIN to the refract binary under test', pytrace=False)
  path = os.path.abspath(path)
  usage = subprocess.run(
    [path, 'serve', '--help'], capture_output=True, text=True, check=False
  ).stdout
  missing = [f for f in ('--worker_pool', '--fn_api_host') if f not in usage]
  if missing:
    pytest.fail(
      '%s has no %s: not a build with remote worker pools' % (path, ' or '.join(missing)),
      pytrace=False,
    )
  return path


class Cluster:
  """Virtual hosts runner, h1, h2 and what the tests start in them."""

  def __init__(self, hosts, refract_bin, work):
    self.hosts = hosts
    self.bin = refract_bin
    self.work = work
    self.runner = hosts['runner']
    self.processes = []  # Logged, for failure reports
    self.servers = []
    self.boot = work / 'pool_boot.sh'
    # The pool's container executable: python_boot.sh with its stdout on
    # stderr (worker_pool_main gives workers a stdout pipe it never reads)
    # after a line naming the worker, in the pool's log.
    self.boot.write_text('#!/bin/sh\necho "pool_boot: worker $*" >&2\nexec %s "$@" 1>&2\n' % BOOT)
    self.boot.chmod(0o755)

  def start(self, host, cmd, what, log_name, env=None, report=True, cwd=None):
    """Starts `cmd` in `host` (in `cwd`, if given); with `report`, a
    failing test's report shows the tail of its log (clients' logs go in
    assertion messages)."""
    log = self.work / log_name
    proc = host.popen(cmd, log=log, env=env or host_env(), cwd=cwd)
    logged = Logged(host, proc, log, what)
    if report:
      self.processes.append(logged)
    return logged

  def python_pool(self, host, port=PY_POOL_PORT):
    pool = self.start(
      host,
      [
        PYTHON,
        '-m',
        PYTHON_POOL_MAIN,
        '--service_port=%d' % port,
        '--container_executable=%s' % self.boot,
      ],
      'python worker pool :%d' % port,
      'pool-py-%s.log' % host.name,
    )
    host.wait_listening(port, pool.proc, timeout_s=60)
    return pool

  def java_pool(self, host, classpath, port=JAVA_POOL_PORT):
    pool = self.start(
      host,
      ['java', '-Xmx256m', '-cp', classpath, JAVA_POOL_MAIN, str(port), '512m'],
      'java worker pool :%d' % port,
      'pool-java-%s.log' % host.name,
    )
    host.wait_listening(port, pool.proc, timeout_s=120)
    return pool

  def serve(self, port, *flags, name='refract', remote=True):
    """`refract serve` in the runner; with `remote`, its Fn API on the
    runner's address (where pool hosts reach it)."""
    cmd = [self.bin, 'serve', '--job_port', str(port), '--serve_http=false', '--sdk_python', PYTHON]
    if remote:
      cmd += ['--host', '0.0.0.0', '--fn_api_host', self.runner.address]
    cmd += list(flags)
    n = sum(1 for s in self.servers if s.args[0].startswith('[runner] ' + name))
    server = self.start(self.runner, cmd, name + ' ' + ' '.join(cmd[2:]), '%s-%d.log' % (name, n))
    server.endpoint = 'localhost:%d' % port
    self.runner.wait_listening(port, server.proc, timeout_s=60, addr='127.0.0.1')
    self.servers.append(server)
    return server

  def submit(self, server, name, output, *extra, wait=True, log_name=None):
    """Starts the client of pipeline `name` in the runner (a Popen)."""
    cmd = [
      PYTHON,
      os.path.abspath(__file__),
      'pipeline',
      name,
      '--job_endpoint',
      server.endpoint,
      '--output',
      str(output),
    ]
    cmd += [str(e) for e in extra]
    if wait:
      cmd.append('--wait')
    return self.start(
      self.runner,
      cmd,
      'client ' + name,
      log_name or 'client-%s-%d.log' % (name, time.time()),
      report=False,
    )

  def status(self, server, job):
    run = self.runner.run([self.bin, 'status', job, '--job_endpoint', server.endpoint], timeout=30)
    first = (run.stdout.strip().splitlines() or [''])[0]
    return (
      first.split(': ', 1)[1].strip()
      if ': ' in first
      else ('unknown (%s%s)' % (run.stdout, run.stderr))
    )

  def wait_state(
    self, server, job, states=('DONE', 'FAILED', 'CANCELLED'), timeout_s=PIPELINE_TIMEOUT_S
  ):
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
      state = self.status(server, job)
      if state in states:
        return state
      time.sleep(0.5)
    raise AssertionError('job %s still %s after %ss' % (job, state, timeout_s))

  def host_of_inode(self):
    return {
      os.stat(os.path.join(netns_hosts.NETNS_DIR, h.namespace)).st_ino: h.name for h in self.hosts
    }


def finish(client, timeout_s=PIPELINE_TIMEOUT_S):
  """Waits for a --wait client; its final state."""
  try:
    client.proc.wait(timeout=timeout_s)
  except subprocess.TimeoutExpired as e:
    raise AssertionError(
      'the client did not finish within %ss:\n%s' % (timeout_s, client.log_tail())
    ) from e
  for line in client.log_text().splitlines():
    if line.startswith('FINAL_STATE '):
      return line.split()[1]
  return 'no final state (exit %s)' % client.proc.returncode


def read_lines(output):
  lines = []
  if os.path.isdir(output):
    for name in sorted(os.listdir(output)):
      if name.startswith('part-') and name.endswith('.txt'):
        with open(os.path.join(output, name)) as f:
          lines.extend(f.read().splitlines())
  return sorted(lines)


def worker_hosts(cluster, output):
  """The hosts whose processes wrote the sink's files."""
  by_inode = cluster.host_of_inode()
  marks = os.listdir(str(output) + '.where') if os.path.isdir(str(output) + '.where') else []
  return collections.Counter(by_inode.get(int(m.split('-')[0]), 'elsewhere') for m in marks)


def expected_count_and_sum(elements, keys):
  return sorted(
    '%d %d %d' % (k, len(range(k, elements, keys)), sum(range(k, elements, keys)))
    for k in range(min(keys, elements))
  )


# --- what each pipeline must produce, computed here --------------------------

WORDS = ['w%s' % chr(ord('a') + i) + chr(ord('a') + j) for i in range(20) for j in range(20)]


def make_wordcount_input(path):
  import random  # pylint: disable=import-outside-toplevel

  rng = random.Random(7)
  with open(path, 'w') as f:
    for _ in range(4000):
      f.write(' '.join(rng.choice(WORDS) for _ in range(10)) + '\n')


def expected_wordcount(path):
  with open(path) as f:
    counts = collections.Counter(re.findall(r'[a-z]+', f.read()))
  return sorted('%s %d' % kv for kv in counts.items())


PYTHON_CASES = {
  # name: (its arguments, its lines), each a function of the work dir
  'wordcount': (
    lambda work: ['--input', work / 'words.txt'],
    lambda work: expected_wordcount(work / 'words.txt'),
  ),
  'gbk': (
    lambda work: ['--elements', 30000, '--keys', 3001],
    lambda work: sorted(
      '%d %d %d %d %d'
      % (k, len(range(k, 30000, 3001)), sum(range(k, 30000, 3001)), k, range(k, 30000, 3001)[-1])
      for k in range(3001)
    ),
  ),
  'combine': (
    lambda work: ['--elements', 30000, '--keys', 97],
    lambda work: sorted(
      '%d %d %d %d'
      % (
        k,
        len(range(k, 30000, 97)),
        sum(range(k, 30000, 97)),
        sum(x * x for x in range(k, 30000, 97)),
      )
      for k in range(97)
    ),
  ),
  'stateful': (
    lambda work: ['--elements', 20000, '--keys', 50],
    lambda work: expected_count_and_sum(20000, 50),
  ),
  'windowed': (lambda work: [], lambda work: expected_windowed()),
}
JAVA_RECORDS = 100000
JAVA_KEYS = 1000


def expected_windowed(windows=6, per_window=100, keys=5):
  sums = collections.Counter()
  for w in range(windows):
    for i in range(w * per_window, (w + 1) * per_window):
      sums[(w * 10, 'k%d' % (i % keys))] += i
  return sorted('%d %s %d' % (start, key, total) for (start, key), total in sums.items())


@pytest.fixture(scope='module')
def same_results_cluster(request, pools_bin, tmp_path_factory):
  """Hosts with a Python and a Java pool in h1 and h2, a server using
  them, and a plain server (local workers), for the six pipelines."""
  work = tmp_path_factory.mktemp('pools-same')
  make_wordcount_input(work / 'words.txt')
  classpath = java_classpath()
  with netns_hosts.VirtualHosts(['runner', 'h1', 'h2']) as hosts:
    cluster = Cluster(hosts, pools_bin, work)
    cluster.classpath = classpath
    pool_flags = []
    for h in (hosts['h1'], hosts['h2']):
      cluster.python_pool(h)
      cluster.java_pool(h, classpath)
      pool_flags += [
        '--worker_pool',
        'python=%s:%d' % (h.address, PY_POOL_PORT),
        '--worker_pool',
        'java=%s:%d' % (h.address, JAVA_POOL_PORT),
      ]
    cluster.local = cluster.serve(JOB_PORT, name='local', remote=False)
    cluster.remote = cluster.serve(JOB_PORT + 1, *pool_flags, name='remote')
    yield cluster


def run_python_case(cluster, server, name, output):
  extra, _ = PYTHON_CASES[name]
  client = cluster.submit(
    server, name, output, *extra(cluster.work), log_name='client-%s-%s.log' % (name, output.name)
  )
  started = time.monotonic()
  state = finish(client)
  return state, time.monotonic() - started, client


def run_java_case(cluster, server, output):
  cmd = [
    'java',
    '-cp',
    cluster.classpath,
    JAVA_BENCH_MAIN,
    '--runner=PortableRunner',
    '--jobEndpoint=' + server.endpoint,
    '--workload=gbk',
    '--records=%d' % JAVA_RECORDS,
    '--keys=%d' % JAVA_KEYS,
    '--output=%s' % output,
  ]
  client = cluster.start(
    cluster.runner,
    cmd,
    'java client',
    'client-java-%s.log' % os.path.basename(output),
    report=False,
  )
  started = time.monotonic()
  try:
    client.proc.wait(timeout=PIPELINE_TIMEOUT_S)
  except subprocess.TimeoutExpired as e:
    raise AssertionError('Java client still running:\n' + client.log_tail()) from e
  return client.proc.returncode, time.monotonic() - started, client


@pytest.mark.parametrize('name', sorted(PYTHON_CASES) + ['java_gbk'])
def test_same_results_locally_and_on_remote_pools(request, same_results_cluster, name):
  cluster = same_results_cluster
  request.node.refract_processes = cluster.processes
  outputs = {}
  seconds = {}
  pool_kind, started_mark = (
    ('java worker pool', 'started worker')
    if name == 'java_gbk'
    else ('python worker pool', 'pool_boot: worker')
  )

  def started_per_pool():
    """Workers each pool host has started so far (its log names them)."""
    return collections.Counter(
      {
        p.host.name: p.log_text().count(started_mark)
        for p in cluster.processes
        if pool_kind in p.args[0]
      }
    )

  for kind, server in (('local', cluster.local), ('remote', cluster.remote)):
    output = cluster.work / ('%s-%s' % (name, kind))
    before = started_per_pool()
    if name == 'java_gbk':
      rc, seconds[kind], client = run_java_case(cluster, server, str(output) + '.txt')
      assert rc == 0, '%s run failed:\n%s' % (kind, client.log_tail())
      with open(str(output) + '.txt') as f:
        outputs[kind] = f.read().split()
    else:
      state, seconds[kind], client = run_python_case(cluster, server, name, output)
      assert state == 'DONE', '%s run ended %s:\n%s' % (kind, state, client.log_tail())
      outputs[kind] = read_lines(output)
    started = started_per_pool()
    started.subtract(before)
    if kind == 'local':
      assert not +started, ('the local server started workers in pools', started)
  if name == 'java_gbk':
    assert outputs['local'] == [str(JAVA_RECORDS * (JAVA_RECORDS - 1) // 2)]
  else:
    want = PYTHON_CASES[name][1](cluster.work)
    assert outputs['local'] == want, describe_difference(outputs['local'], want)
    local_hosts = worker_hosts(cluster, cluster.work / ('%s-local' % name))
    remote_hosts = worker_hosts(cluster, cluster.work / ('%s-remote' % name))
    assert set(local_hosts) == {'runner'}, local_hosts
    assert remote_hosts and set(remote_hosts) <= {'h1', 'h2'}, remote_hosts
  assert outputs['remote'] == outputs['local'], describe_difference(
    outputs['remote'], outputs['local']
  )
  report(
    'same_results',
    pipeline=name,
    local_s=round(seconds['local'], 1),
    remote_s=round(seconds['remote'], 1),
    workers_started=dict(started),
    lines=len(outputs['local']),
  )
  # The remote run's workers started in both pools.
  assert started['h1'] > 0 and started['h2'] > 0, started


def describe_difference(got, want):
  missing = sorted(set(want) - set(got))
  extra = sorted(set(got) - set(want))
  return '%d lines, %d expected; missing %s; unexpected %s' % (
    len(got),
    len(want),
    missing[:10],
    extra[:10],
  )


# --- fault tests --------------------------------------------------------------


class Progress:
  """The slow step's logs: (time, element, host, pid) per element done."""

  def __init__(self, cluster, output):
    self.dir = str(output) + '.progress'
    self.by_inode = cluster.host_of_inode()

  def entries(self):
    found = []
    if not os.path.isdir(self.dir):
      return found
    for name in os.listdir(self.dir):
      inode, pid = name[: -len('.log')].split('-')
      host = self.by_inode.get(int(inode), 'elsewhere')
      with open(os.path.join(self.dir, name)) as f:
        for line in f:
          parts = line.split()
          if len(parts) == 2:
            found.append((float(parts[1]), int(parts[0]), host, int(pid)))
    return sorted(found)

  def wait_for_both_hosts(
    self, cluster, client, victim='h1', timeout_s=120, min_done=100, waiting=True
  ):
    """Waits until both pool hosts have done elements, at least
    `min_done` in all, and `victim` did one in the last second: the job is
    well under way and the victim has a bundle in flight."""
    deadline = time.monotonic() + timeout_s
    while True:
      entries = self.entries()
      hosts = collections.Counter(e[2] for e in entries)
      recent = [e for e in entries if e[2] == victim and e[0] > time.time() - 1.0]
      if len(hosts) >= 2 and len(entries) >= min_done and recent:
        return entries
      assert not waiting or client.proc.poll() is None, (
        'the job ended before the fault:\n' + client.log_tail()
      )
      assert time.monotonic() < deadline, 'progress by host after %ss: %s; server log:\n%s' % (
        timeout_s,
        dict(hosts),
        cluster.servers[-1].log_tail(),
      )
      time.sleep(0.2)


def recovery_times(entries, victim, fault_at):
  """What the progress logs say about the fault: when the first element
  the victim had done (and lost) was done again on another host, and the
  longest pause of the other hosts' progress after the fault."""
  victim_done = {e[1] for e in entries if e[2] == victim}
  redone = [e[0] for e in entries if e[2] != victim and e[0] > fault_at and e[1] in victim_done]
  others = [e[0] for e in entries if e[2] != victim and e[0] > fault_at]
  gaps = [b - a for a, b in zip([fault_at] + others, others, strict=False)]
  return dict(
    first_redo_s=round(min(redone) - fault_at, 2) if redone else None,
    redone_elements=len(redone),
    first_other_progress_s=round(others[0] - fault_at, 2) if others else None,
    longest_pause_s=round(max(gaps), 2) if gaps else None,
    elements_logged=len(entries),
    distinct_elements=len({e[1] for e in entries}),
  )


def log_time(line):
  """The UTC time a server log line starts with (seconds since the epoch),
  or None."""
  m = re.match(r'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)', line)
  if not m:
    return None
  text = m.group(1)
  if '.' in text:
    head, frac = text.split('.')
    text = head + '.' + frac[:6]
    fmt = '%Y-%m-%dT%H:%M:%S.%f'
  else:
    fmt = '%Y-%m-%dT%H:%M:%S'
  return datetime.datetime.strptime(text, fmt).replace(tzinfo=datetime.timezone.utc).timestamp()


def server_lines_after(server, at, pattern):
  """(seconds after `at`, line) of the server's log lines matching
  `pattern` (a regex), logged after `at`."""
  found = []
  for line in server.log_text().splitlines():
    t = log_time(line)
    if t is not None and t >= at - 0.5 and re.search(pattern, line, re.I):
      found.append((round(t - at, 2), line.strip()[:300]))
  return found


@pytest.fixture
def cluster(request, pools_bin, tmp_path):
  """Hosts runner, h1, h2 with a Python pool in h1 and h2."""
  with netns_hosts.VirtualHosts(['runner', 'h1', 'h2']) as hosts:
    c = Cluster(hosts, pools_bin, tmp_path)
    request.node.refract_processes = c.processes
    c.pool_flags = {}
    for h in (hosts['h1'], hosts['h2']):
      c.python_pool(h)
      c.pool_flags[h.name] = ['--worker_pool', 'python=%s:%d' % (h.address, PY_POOL_PORT)]
    yield c


def slow_args():
  return ['--elements', SLOW_ELEMENTS, '--sleep', SLOW_SLEEP_S, '--keys', SLOW_KEYS]


def assert_exact(output):
  got = read_lines(output)
  want = expected_count_and_sum(SLOW_ELEMENTS, SLOW_KEYS)
  assert got == want, describe_difference(got, want)


def loss_lines(server, at, host):
  return server_lines_after(server, at, r'lost|quarantin|unreachable|%s' % re.escape(host.address))


def started_workers(cluster):
  """Host name -> workers its Python pool has started so far."""
  return {
    p.host.name: p.log_text().count('pool_boot: worker')
    for p in cluster.processes
    if 'python worker pool' in p.args[0]
  }


def list_pools(cluster, server):
  """`refract pools list` of `server` (its output, or why not)."""
  listed = cluster.runner.run(
    [cluster.bin, 'pools', 'list', '--job_endpoint', server.endpoint], timeout=30
  )
  return (
    listed.stdout
    if listed.returncode == 0
    else ('pools list failed: %s%s' % (listed.stdout, listed.stderr))
  )


def fault_test(cluster, fault, name, workers=None):
  """Runs the slow pipeline on pools in h1 and h2 (`workers` SDK workers,
  default the pools' capacity), applies `fault(h1)` once both are at work,
  and checks the job ends DONE with exact results; reports how the
  recovery went."""
  server = cluster.serve(JOB_PORT, *(cluster.pool_flags['h1'] + cluster.pool_flags['h2']))
  output = cluster.work / 'out'
  started = time.monotonic()
  extra = slow_args()
  if workers:
    extra.append('--sdk_worker_parallelism=%d' % workers)
  client = cluster.submit(server, 'slow', output, *extra)
  progress = Progress(cluster, output)
  before = progress.wait_for_both_hosts(cluster, client)
  h1 = cluster.hosts['h1']
  workers_before = started_workers(cluster)
  fault_at = time.time()
  fault(h1)
  # How the server sees the pools once the loss should have been noticed.
  pools_mid = None
  while client.proc.poll() is None:
    if time.time() > fault_at + LIVENESS_BOUND_S + 1:
      pools_mid = list_pools(cluster, server).strip().splitlines()
      break
    time.sleep(0.2)
  state = finish(client)
  total_s = time.monotonic() - started
  assert state == 'DONE', 'job ended %s:\n%s' % (state, client.log_tail())
  assert_exact(output)
  entries = progress.entries()
  measured = recovery_times(entries, 'h1', fault_at)
  noticed = loss_lines(server, fault_at, h1)
  replaced_on_h2 = started_workers(cluster)['h2'] - workers_before['h2']
  report(
    name,
    workers=workers or 'capacity',
    job_s=round(total_s, 1),
    fault_after_elements=len(before),
    workers_before=workers_before,
    replacements_on_h2=replaced_on_h2,
    pools_mid_job=pools_mid,
    pools_after=list_pools(cluster, server).strip().splitlines(),
    first_loss_log=noticed[:3],
    **measured,
  )
  # h1's workers were replaced on the pool that is left.
  assert replaced_on_h2 > 0, (workers_before, started_workers(cluster))
  return measured, noticed


# 8 workers: 4 on h1, whose bundles all fail at once when it goes (more
# than a batch job's 4 failed attempts in a row, were they counted so).
@pytest.mark.parametrize('workers', [None, 8], ids=['capacity', '8_workers'])
def test_host_killed_mid_job(cluster, workers):
  measured, _ = fault_test(cluster, lambda h1: h1.kill_all(signal.SIGKILL), 'host_killed', workers)
  # Elements h1 had in flight were done again elsewhere, promptly: its
  # connections were reset (its kernel lives on), no keepalive needed.
  assert measured['first_redo_s'] is not None, measured
  assert measured['first_redo_s'] <= LIVENESS_BOUND_S, measured


def test_host_cut_off_mid_job(cluster):
  measured, noticed = fault_test(cluster, lambda h1: h1.link_down(), 'host_cut_off')
  # Nothing told the runner: only keepalives could notice, within the
  # bound, and h1's lost elements were done again elsewhere.
  assert measured['first_redo_s'] is not None, measured
  assert measured['first_redo_s'] <= LIVENESS_BOUND_S + 5, (measured, noticed)


def distinct_events(cluster, server, job):
  """recovery_pipeline.py's committed `distinct_events` counter, as
  `refract status` prints it."""
  out = cluster.runner.run(
    [cluster.bin, 'status', job, '--job_endpoint', server.endpoint], timeout=30
  ).stdout
  found = re.findall(r'recovery:distinct_events\S*\s.*=\s*(\d+)', out)
  return sum(int(v) for v in found) if found else out


def test_runner_killed_and_restarted(cluster):
  """A durable job (`--state_dir`) on unlabelled pools: recovery_pipeline.py
  (test_recovery.py's streaming pipeline, PROCESS environment, per-key
  state deduplicating numbered events) is killed with the server mid-job;
  the server started again with the same flags resumes it from its latest
  checkpoint on new workers in the pools, and its results are exact."""
  from test_recovery import expected_results, read_results  # pylint: disable=import-outside-toplevel

  events = RECOVERY_EVENTS
  state_dir = cluster.work / 'state'
  flags = ['--state_dir', str(state_dir), '--checkpoint_interval', '200ms']
  for h in (cluster.hosts['h1'], cluster.hosts['h2']):
    flags += ['--worker_pool', '%s:%d' % (h.address, PY_POOL_PORT)]
  server = cluster.serve(JOB_PORT, *flags)
  output = cluster.work / 'out'
  output.mkdir()
  submitted = cluster.runner.run(
    [
      PYTHON,
      RECOVERY_PIPELINE,
      '--job_endpoint',
      server.endpoint,
      '--output',
      str(output),
      '--events',
      str(events),
      '--boot',
      BOOT,
      '--pause',
      str(RECOVERY_PAUSE_S),
    ],
    env=host_env(),
    timeout=180,
  )
  assert submitted.returncode == 0, submitted.stderr[-3000:]
  job = submitted.stdout.strip().splitlines()[-1]
  deadline = time.monotonic() + 120
  while len([n for n in os.listdir(output) if n.endswith('.json')]) < 6:
    assert time.monotonic() < deadline, server.log_tail()
    assert cluster.status(server, job) == 'RUNNING', server.log_tail()
    time.sleep(0.2)
  time.sleep(1)  # checkpoints (every 200 ms) with those windows in them
  assert cluster.status(server, job) == 'RUNNING', server.log_tail()
  started_before = started_workers(cluster)
  written_before = {
    n: os.stat(output / n).st_mtime for n in os.listdir(output) if n.endswith('.json')
  }
  killed_at = time.time()
  os.killpg(server.proc.pid, signal.SIGKILL)
  server.proc.wait(timeout=10)
  # The pools live on; their workers lose their runner.
  restarted = cluster.serve(JOB_PORT, *flags)
  restarted_at = time.time()
  assert cluster.wait_state(restarted, job) == 'DONE', restarted.log_tail()
  done_at = time.time()
  log = restarted.log_text()
  assert 'resuming from the job' in log, log[-3000:]
  assert distinct_events(cluster, restarted, job) == events
  assert read_results(output) == expected_results(events)
  # Resumed, not started over: windows written before the kill (and in a
  # checkpoint) were not written again.
  rewritten = [n for n, t in written_before.items() if os.stat(output / n).st_mtime != t]
  kept = len(written_before) - len(rewritten)
  # The new workers started in the pools.
  started_after = started_workers(cluster)
  new_workers = {h: started_after[h] - started_before.get(h, 0) for h in started_after}
  firsts = [
    os.stat(output / n).st_mtime
    for n in os.listdir(output)
    if n.endswith('.json') and n not in written_before
  ]
  report(
    'runner_restarted',
    windows_before_kill=len(written_before),
    windows_not_rewritten=kept,
    restart_s=round(restarted_at - killed_at, 1),
    first_new_result_after_restart_s=round(min(firsts) - restarted_at, 2) if firsts else None,
    done_after_restart_s=round(done_at - restarted_at, 1),
    workers_started_after_restart=new_workers,
  )
  assert kept > 0, ('every window was written again: the job started over', rewritten)
  assert sum(new_workers.values()) > 0, new_workers


def test_pool_added_mid_job(cluster):
  """Only h1's pool at first (its capacity: 2 workers); mid-job, `refract
  pools add` names h2's. The job's worker count follows its pools'
  capacity, so it starts workers on h2 at once, and they share the work.
  Should it not within GROW_S, h1 is killed, to tell "never places workers
  on an added pool" from "does not grow a running job" in the failure."""
  h1, h2 = cluster.hosts['h1'], cluster.hosts['h2']
  server = cluster.serve(JOB_PORT, *cluster.pool_flags['h1'])
  output = cluster.work / 'out'
  client = cluster.submit(server, 'slow', output, *slow_args())
  progress = Progress(cluster, output)
  deadline = time.monotonic() + 120
  while not any(e[2] == 'h1' for e in progress.entries()):
    assert time.monotonic() < deadline, server.log_tail()
    assert client.proc.poll() is None, client.log_tail()
    time.sleep(0.2)
  time.sleep(2)  # well into the job: h1's workers hold all its bundles
  h2_pool = [p for p in cluster.processes if p.host is h2 and 'worker pool' in p.args[0]][0]

  def h2_started():
    return h2_pool.log_text().count('pool_boot: worker')

  assert h2_started() == 0
  spec = 'python=%s:%d' % (h2.address, PY_POOL_PORT)
  added = cluster.runner.run(
    [cluster.bin, 'pools', 'add', '--job_endpoint', server.endpoint, spec], timeout=30
  )
  added_at = time.time()
  assert added.returncode == 0, added.stdout + added.stderr
  listed = list_pools(cluster, server)
  assert h2.address in listed, listed

  deadline = time.monotonic() + GROW_S
  while not h2_started() and time.monotonic() < deadline:
    time.sleep(0.2)
  grew_after = round(time.time() - added_at, 2) if h2_started() else None
  replaced_on_h2 = None
  if grew_after is None:
    h1.kill_all(signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not h2_started() and time.monotonic() < deadline:
      time.sleep(0.5)
    replaced_on_h2 = h2_started()
  listed_later = list_pools(cluster, server)
  state = finish(client)
  assert state == 'DONE', client.log_tail()
  assert_exact(output)
  entries = progress.entries()
  on_h2 = [e for e in entries if e[2] == 'h2']
  report(
    'pool_added',
    running_job_grew_after_s=grew_after,
    replacements_on_h2_after_killing_h1=replaced_on_h2,
    workers_started_on_h2=h2_started(),
    first_h2_progress_s=round(on_h2[0][0] - added_at, 2) if on_h2 else None,
    pools_at_add=listed.strip().splitlines(),
    pools_later=listed_later.strip().splitlines(),
  )
  assert grew_after is not None, (
    'no worker started on the added pool within %ss (after h1 was killed: '
    '%s); pools:\n%s' % (GROW_S, replaced_on_h2, listed_later)
  )
  assert on_h2, 'workers started on h2 did no work'


# --- refract worker-pool --------------------------------------------------------

# A StartWorker call with no token (argv[1]: the pool); prints the status.
START_WORKER_WITHOUT_TOKEN = """
import sys, grpc
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc
from apache_beam.portability.api import endpoints_pb2
stub = beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(
    grpc.insecure_channel(sys.argv[1]))
url = endpoints_pb2.ApiServiceDescriptor(url='127.0.0.1:1')
try:
  stub.StartWorker(beam_fn_api_pb2.StartWorkerRequest(
      worker_id='intruder', control_endpoint=url, provision_endpoint=url),
      timeout=30)
  print('SERVED')
except grpc.RpcError as e:
  print(e.code().name)
"""

REFRACT_POOL_PORT = 50300


def common_sh(helper):
  """Runs an integration/common.sh helper printing a path; the path."""
  import xlang_services  # pylint: disable=import-outside-toplevel

  return xlang_services.common_sh(helper)


def test_refract_worker_pool_runs_go_and_python_workers(request, pools_bin, tmp_path):
  """`refract worker-pool --boot BOOT` as the pool of hosts whose SDK image
  has no pool mode of its own (Beam's Go and Java images): h1 runs one with
  the boot program of Go's image, h2 one with python_boot.sh. The Go word
  count (Go's default environment, DOCKER apache/beam_go_sdk) runs its
  workers on h1, the Python word count on h2, each boot program fetching
  the job's staged files (the Go pipeline binary, Python's options) from
  the runner over the Fn API; the counts are exact."""
  from test_go_sdk import INPUT as GO_INPUT  # pylint: disable=import-outside-toplevel
  from test_go_sdk import expected_counts as go_expected  # pylint: disable=import-outside-toplevel
  from test_go_sdk import read_counts as read_go_counts  # pylint: disable=import-outside-toplevel

  go_boot = common_sh('refract_go_boot_bin')
  go_wordcount = common_sh('refract_go_wordcount_bin')
  make_wordcount_input(tmp_path / 'words.txt')
  # The server and its pools share a token; calls without it are refused.
  token_file = tmp_path / 'pool-token'
  token_file.write_text('%s\n' % os.urandom(16).hex())
  token_file.chmod(0o600)
  with netns_hosts.VirtualHosts(['runner', 'h1', 'h2']) as hosts:
    cluster = Cluster(hosts, pools_bin, tmp_path)
    request.node.refract_processes = cluster.processes
    h1, h2 = hosts['h1'], hosts['h2']
    pools = {}
    for host, sdk, boot in ((h1, 'go', go_boot), (h2, 'python', cluster.boot)):
      # Go's boot program writes pipeline_options.json where it runs.
      cwd = tmp_path / ('pool-%s' % sdk)
      cwd.mkdir()
      pools[sdk] = cluster.start(
        host,
        [
          pools_bin,
          'worker-pool',
          '--host',
          '0.0.0.0',
          '--port',
          REFRACT_POOL_PORT,
          '--boot',
          boot,
          '--token_file',
          str(token_file),
        ],
        'refract worker-pool (%s)' % sdk,
        'pool-refract-%s.log' % sdk,
        cwd=str(cwd),
      )
      host.wait_listening(REFRACT_POOL_PORT, pools[sdk].proc, timeout_s=30)
    server = cluster.serve(
      JOB_PORT,
      '--worker_pool',
      'go=%s:%d' % (h1.address, REFRACT_POOL_PORT),
      '--worker_pool',
      'python=%s:%d' % (h2.address, REFRACT_POOL_PORT),
      '--worker_pool_token_file',
      str(token_file),
    )

    counts = tmp_path / 'go-counts.txt'
    go_run = cluster.runner.run(
      [
        go_wordcount,
        '--input',
        GO_INPUT,
        '--output',
        counts,
        '--runner=universal',
        '--endpoint=' + server.endpoint,
        '--worker_binary=' + go_wordcount,
      ],
      env=host_env(),
      timeout=300,
    )
    assert go_run.returncode == 0, go_run.stderr[-4000:]
    assert read_go_counts(counts) == go_expected()

    output = tmp_path / 'py-out'
    client = cluster.submit(server, 'wordcount', output, '--input', tmp_path / 'words.txt')
    state = finish(client)
    assert state == 'DONE', client.log_tail()
    assert read_lines(output) == expected_wordcount(tmp_path / 'words.txt')
    assert set(worker_hosts(cluster, output)) == {'h2'}, worker_hosts(cluster, output)

    # Another host's caller without the token is refused before anything
    # runs.
    anonymous = cluster.runner.run(
      [sys.executable, '-c', START_WORKER_WITHOUT_TOKEN, '%s:%d' % (h2.address, REFRACT_POOL_PORT)],
      env=host_env(),
      timeout=60,
    )
    assert anonymous.returncode == 0, anonymous.stderr[-4000:]
    assert anonymous.stdout.strip() == 'UNAUTHENTICATED', anonymous.stdout

    started = {sdk: pool.log_text().count('starting worker') for sdk, pool in pools.items()}
    report('refract_worker_pool', workers_started=started)
    assert started['go'] > 0 and started['python'] > 0, started
