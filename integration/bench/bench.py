"""Refract's end-to-end benchmarks: the same Python pipelines on Refract and
on peer runners, in the same run, with the ratios.

Normally started by integration/bench/run.sh, which sets up the virtualenv,
builds refract and Prism, and passes their paths. Run directly:

  python bench.py --refract BIN [--prism BIN] [--workloads gbk,pardo,...]

Each runner is a job server started once (on a free port) and kept for all
workloads: `refract serve --job_port N`, `python -m
apache_beam.runners.portability.local_job_service_main --port N`, `prism
--job_port N`. Every workload is a client process submitting with
--runner=PortableRunner --job_endpoint=localhost:N --environment_type=LOOPBACK,
so the SDK workers are the same Python code for every runner. This
directory is first on PYTHONPATH for clients and servers: its
sitecustomize.py makes time.sleep(0) a no-op everywhere.

Sizes come from environment variables (see docs/benchmarks.md):
  REFRACT_BENCH_GBK_RECORDS     GroupByKey load test records   (default 500000)
  REFRACT_BENCH_PARDO_RECORDS   ParDo load test records        (default 1000000)
  REFRACT_BENCH_PARDO_STEPS     ParDo chain length             (default 4)
  REFRACT_BENCH_COMBINE_RECORDS Combine load test records      (default 1000000)
  REFRACT_BENCH_WORDCOUNT_MB    generated text for wordcount   (default 16)
  REFRACT_BENCH_EVENTS          events for the events pipelines (default 300000)
  REFRACT_BENCH_TINY_JOBS       tiny jobs back to back         (default 100)
  REFRACT_BENCH_REPEATS         runs of each timed workload    (default 1)
  REFRACT_BENCH_TIMEOUT         seconds before a run is killed (default 600)
The issue's full-scale target is REFRACT_BENCH_GBK_RECORDS=10000000.
"""

import argparse
import json
import os
import random
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TIMED = os.path.join(HERE, 'timed_client.py')
WORDCOUNT = os.path.join(ROOT, 'integration', 'wordcount', 'wordcount.py')
EVENTS = os.path.join(HERE, 'events.py')

ALL_WORKLOADS = [
  'gbk',
  'pardo',
  'combine',
  'wordcount',
  'events',
  'events_streaming',
  'tiny',
  'suite',
]
DEFAULT_WORKLOADS = ['gbk', 'pardo', 'combine', 'wordcount', 'events', 'events_streaming', 'tiny']
# Workloads whose outputs every runner must agree on (file prefixes).
EVENTS_WORKLOADS = ['events', 'events_streaming']
CLOCK_TICKS = os.sysconf('SC_CLK_TCK')
PRISM_SUITE = os.path.join(ROOT, 'integration', 'prism_suite.sh')
PYTHON_JOB_SERVER_BIN = os.path.join(ROOT, 'integration', 'beam_suite', 'python_job_server.sh')
sys.path.insert(0, os.path.join(ROOT, 'integration', 'python'))

from refract_testlib import free_port, python_job_server_argv, wait_for_port  # noqa: E402  # pylint: disable=wrong-import-position


def env_int(name, default):
  v = os.environ.get(name)
  return int(v) if v else default


def log(msg):
  print('bench: %s' % msg, file=sys.stderr, flush=True)


def job_server_timeout():
  """The client's Job API calls, its job-state stream included, have a
  deadline (300 s by default): a run longer than that fails on the client's
  side, whatever the runner does. This gives it the bench's timeout."""
  return '--job_server_timeout=%d' % env_int('REFRACT_BENCH_TIMEOUT', 600)


def child_env():
  env = dict(os.environ)
  env['PYTHONPATH'] = HERE + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
  return env


class Server:
  """One job server process, on its own port, logging to a file."""

  def __init__(self, name, argv_for_port, logdir):
    self.name = name
    self.port = free_port()
    self.key = str(self.port)  # names this runner's output directories
    self.argv = argv_for_port(self.port)
    self.log_path = os.path.join(logdir, '%s.log' % name.replace(' ', '_'))
    self.proc = None

  def start(self, wait_s=120):
    log(
      'starting %s: %s (log %s)' % (self.name, ' '.join(map(shlex.quote, self.argv)), self.log_path)
    )
    self.log = open(self.log_path, 'wb')
    self.proc = subprocess.Popen(
      self.argv,
      stdin=subprocess.DEVNULL,
      stdout=self.log,
      stderr=subprocess.STDOUT,
      env=child_env(),
      start_new_session=True,
    )
    wait_for_port(self.port, self.proc, '%s (log %s)' % (self.name, self.log_path), wait_s)

  def stop(self):
    if self.proc and self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=10)
      except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
          os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass

  def cpu_seconds(self):
    """CPU time of the server process and its reaped children so far."""
    try:
      with open('/proc/%d/stat' % self.proc.pid) as f:
        fields = f.read().rsplit(')', 1)[1].split()
      # utime, stime, cutime, cstime: fields 14-17 of stat(5).
      return sum(int(x) for x in fields[11:15]) / CLOCK_TICKS
    except (OSError, AttributeError, IndexError, ValueError):
      return None

  def pipeline_options(self):
    options = [
      '--runner=PortableRunner',
      '--job_endpoint=localhost:%d' % self.port,
      '--environment_type=LOOPBACK',
    ]
    if os.environ.get('REFRACT_BENCH_LOOPBACK_PROCESSES') == '1':
      # The client's worker pool starts each SDK worker the runner asks for
      # as a process of its own, not a thread under the client's GIL: a
      # runner that starts several workers then gets several cores.
      options.append('--experiments=use_loopback_process_worker')
    options.append(job_server_timeout())
    workers = os.environ.get('REFRACT_BENCH_SDK_WORKERS')
    if workers:
      # Python's default is 1 (and runners honour it): the same number of
      # SDK workers for every runner.
      options.append('--sdk_worker_parallelism=' + workers)
    return options


class RefractRun:
  """Not a server: every timed workload runs through `refract run` against
  `server`'s job endpoint, which picks the worker options itself."""

  # The runner's CPU is partly in the client's process tree (the workers).
  cpu_in_client_tree = True

  def __init__(self, server, refract):
    self.name = 'refract run'
    self.server = server
    self.refract = refract
    self.port = server.port
    self.key = 'run-%d' % server.port

  def start(self):
    pass

  def stop(self):
    pass

  def cpu_seconds(self):
    return self.server.cpu_seconds()

  def wrap(self, argv):
    """`python TIMED ARGS...` as `refract run` runs it."""
    return [
      self.refract,
      'run',
      '--job_endpoint',
      'localhost:%d' % self.port,
      '--python',
      argv[0],
    ] + argv[1:]

  def pipeline_options(self):
    return [job_server_timeout()]


class PrismRunnerPath:
  """Not a server: each client starts its own Refract through Beam's
  PrismRunner (`--runner=PrismRunner --prism_location=BIN`), as a Python
  user who names Refract as their Prism does; the runner's start is in
  the job's time, and its CPU in the client's process tree."""

  cpu_in_client_tree = True

  def __init__(self, refract):
    self.name = 'PrismRunner path'
    self.refract = refract
    self.key = 'prism-path'

  def start(self):
    pass

  def stop(self):
    pass

  def cpu_seconds(self):
    return 0.0

  def pipeline_options(self):
    return ['--runner=PrismRunner', '--prism_location=' + self.refract, job_server_timeout()]


def job_seconds(out, what='BENCH_JOB_SECONDS'):
  """The client's "BENCH_JOB_SECONDS s" line (timed_client.py), or None;
  `what='BENCH_JOB_CPU_SECONDS'` reads the client's CPU time instead."""
  for line in out.splitlines():
    if line.startswith(what + ' '):
      return float(line.split()[1])
  return None


def output_digest(prefix):
  """The sorted lines of every file starting with `prefix`, hashed: the
  same results from every runner give the same digest."""
  import glob
  import hashlib

  lines = []
  for path in sorted(glob.glob(prefix + '*')):
    with open(path, 'rb') as f:
      lines.extend(f.read().splitlines())
  return hashlib.sha256(b'\n'.join(sorted(lines))).hexdigest()[:16], len(lines)


def children_cpu_seconds():
  """CPU time of this process's children that ended and were waited for,
  theirs included (getrusage(RUSAGE_CHILDREN))."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def run_timed(argv, timeout, cwd=None):
  """Runs a client; returns (wall seconds, ok, output)."""
  t0 = time.perf_counter()
  try:
    p = subprocess.run(
      argv,
      stdin=subprocess.DEVNULL,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      env=child_env(),
      cwd=cwd,
      timeout=timeout,
      start_new_session=True,
    )
    dt = time.perf_counter() - t0
    out = p.stdout.decode('utf-8', 'replace')
    return dt, p.returncode == 0, out
  except subprocess.TimeoutExpired as e:
    out = (e.stdout or b'').decode('utf-8', 'replace')
    return time.perf_counter() - t0, False, 'TIMEOUT after %ss\n%s' % (timeout, out[-3000:])


def synthetic(records, key, value):
  return json.dumps(
    {
      'num_records': records,
      'key_size': key,
      'value_size': value,
      'algorithm': 'lcg',
    }
  )


def load_test(module, server, extra):
  """A Beam load test through timed_client.py, which hands it every option
  in its one --test-pipeline-options string (also those `refract run`
  adds)."""
  return [sys.executable, TIMED, '--load_test=' + module] + server.pipeline_options() + extra


def generate_text(path, megabytes, seed=7):
  """Deterministic pseudo-English: Zipf-ish words from a fixed vocabulary."""
  rng = random.Random(seed)
  syll = ['ka', 'lo', 'mi', 'ne', 'ru', 'sa', 'to', 've', 'zi', 'an', 'or', 'el', 'th', 'qu', 'is']
  vocab = [''.join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(20000)]
  weights = [1.0 / (i + 1) for i in range(len(vocab))]
  target = megabytes * 1024 * 1024
  written = 0
  with open(path, 'w') as f:
    while written < target:
      words = rng.choices(vocab, weights, k=4096)
      lines = [' '.join(words[i : i + 12]) for i in range(0, len(words), 12)]
      chunk = '\n'.join(lines) + '\n'
      f.write(chunk)
      written += len(chunk)


TINY_CLIENT = r'''
# n tiny jobs back to back in one client. Two latencies per job:
#   client: Pipeline.run() until wait_until_finish() returns (what a test
#           suite sees; includes the SDK's own per-job work: proto
#           conversion, starting the LOOPBACK worker pool, draining the
#           message stream);
#   runner: the Prepare call until the terminal state arrives on the state
#           stream (job service + runner: prepare, staging, run, execution).
import json, sys, time
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability import portable_runner as pr
from apache_beam.portability.api import beam_job_api_pb2

marks = {}
_prepare = pr.JobServiceHandle.prepare
def prepare(self, *a, **k):
  marks['prepare'] = time.perf_counter()
  return _prepare(self, *a, **k)
pr.JobServiceHandle.prepare = prepare

TERMINAL = (beam_job_api_pb2.JobState.DONE, beam_job_api_pb2.JobState.FAILED,
            beam_job_api_pb2.JobState.CANCELLED)
_init = pr.PipelineResult.__init__
def init(self, job_service, job_id, message_stream, state_stream, *a, **k):
  def watched(stream):
    for ev in stream:
      if ev.state in TERMINAL and 'terminal' not in marks:
        marks['terminal'] = time.perf_counter()
      yield ev
  _init(self, job_service, job_id, message_stream, watched(state_stream),
        *a, **k)
pr.PipelineResult.__init__ = init

n = int(sys.argv[1]); opts = sys.argv[2:]
client, runner = [], []
for i in range(n):
  marks.clear()
  p = beam.Pipeline(options=PipelineOptions(opts))
  _ = (p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2)
         | beam.combiners.Count.Globally())
  t0 = time.perf_counter()
  state = p.run().wait_until_finish()
  client.append(time.perf_counter() - t0)
  runner.append(marks['terminal'] - marks['prepare'])
  assert 'DONE' in str(state), state
print('TINY_LATENCIES ' + json.dumps({'client': client, 'runner': runner}))
'''


def percentile(xs, q):
  xs = sorted(xs)
  if not xs:
    return float('nan')
  k = (len(xs) - 1) * q
  lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
  return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--refract', required=True, help='refract binary')
  ap.add_argument('--prism', help='prism binary (omit to skip Prism)')
  ap.add_argument(
    '--refract-run',
    action='store_true',
    help='also run every timed workload through `refract run` '
    'against the Refract server, as the runner "refract run": '
    'its default worker processes',
  )
  ap.add_argument(
    '--prism-runner-path',
    action='store_true',
    help='also run every workload with --runner=PrismRunner '
    '--prism_location=REFRACT, as the runner "PrismRunner '
    'path": each client starts its own Refract',
  )
  ap.add_argument(
    '--baseline',
    help='another refract binary (an earlier commit, say), run '
    'as the runner "Refract baseline" in the same run',
  )
  ap.add_argument('--no-python-server', action='store_true')
  ap.add_argument(
    '--workloads',
    default=os.environ.get('REFRACT_BENCH_WORKLOADS', ','.join(DEFAULT_WORKLOADS)),
    help='comma-separated, from: %s (default: %s)'
    % (','.join(ALL_WORKLOADS), ','.join(DEFAULT_WORKLOADS)),
  )
  ap.add_argument('--json', help='also write results here')
  args = ap.parse_args()

  workloads = [w for w in args.workloads.split(',') if w]
  for w in workloads:
    if w not in ALL_WORKLOADS:
      ap.error('unknown workload %r (known: %s)' % (w, ','.join(ALL_WORKLOADS)))

  gbk_n = env_int('REFRACT_BENCH_GBK_RECORDS', 500000)
  pardo_n = env_int('REFRACT_BENCH_PARDO_RECORDS', 1000000)
  pardo_steps = env_int('REFRACT_BENCH_PARDO_STEPS', 4)
  combine_n = env_int('REFRACT_BENCH_COMBINE_RECORDS', 1000000)
  wc_mb = env_int('REFRACT_BENCH_WORDCOUNT_MB', 16)
  events_n = env_int('REFRACT_BENCH_EVENTS', 300000)
  tiny_n = env_int('REFRACT_BENCH_TINY_JOBS', 100)
  repeats = env_int('REFRACT_BENCH_REPEATS', 1)
  timeout = env_int('REFRACT_BENCH_TIMEOUT', 600)

  workdir = tempfile.mkdtemp(prefix='refract-bench.')
  log('work dir (server logs, generated input): %s' % workdir)

  servers = [Server('Refract', lambda p: [args.refract, 'serve', '--job_port', str(p)], workdir)]
  if args.refract_run:
    servers.append(RefractRun(servers[0], args.refract))
  if args.prism_runner_path:
    servers.append(PrismRunnerPath(args.refract))
  if args.baseline:
    servers.append(
      Server('Refract baseline', lambda p: [args.baseline, 'serve', '--job_port', str(p)], workdir)
    )
  if not args.no_python_server:
    servers.append(
      Server(
        'Python job server',
        python_job_server_argv,
        workdir,
      )
    )
  if args.prism:
    servers.append(
      Server('Prism', lambda p: [args.prism, '--job_port', str(p), '--serve_http=false'], workdir)
    )

  # (workload label, detail, argv builder(server, run index) or None)
  timed = []
  if 'gbk' in workloads:
    timed.append(
      (
        'gbk',
        'GroupByKey load test, %d x (10 B key + 10 B value)' % gbk_n,
        lambda s, i: load_test(
          'group_by_key_test',
          s,
          ['--input_options=' + synthetic(gbk_n, 10, 10), '--fanout=1', '--iterations=1'],
        ),
      )
    )
  if 'pardo' in workloads:
    timed.append(
      (
        'pardo',
        'ParDo load test, %d x 20 B records, %d steps' % (pardo_n, pardo_steps),
        lambda s, i: load_test(
          'pardo_test',
          s,
          [
            '--input_options=' + synthetic(pardo_n, 10, 10),
            '--iterations=%d' % pardo_steps,
            '--number_of_counter_operations=0',
            '--number_of_counters=0',
          ],
        ),
      )
    )
  if 'combine' in workloads:
    timed.append(
      (
        'combine',
        'Combine load test (Top 20), %d x 20 B records' % combine_n,
        lambda s, i: load_test(
          'combine_test',
          s,
          ['--input_options=' + synthetic(combine_n, 10, 10), '--fanout=1', '--top_count=20'],
        ),
      )
    )
  if 'wordcount' in workloads:
    text = os.path.join(workdir, 'text.txt')
    log('generating %d MB of text for wordcount' % wc_mb)
    generate_text(text, wc_mb)
    timed.append(
      (
        'wordcount',
        'wordcount.py over %d MB of generated text' % wc_mb,
        lambda s, i: (
          [
            sys.executable,
            TIMED,
            WORDCOUNT,
            '--input',
            text,
            '--output',
            os.path.join(workdir, 'wc-%s-%d' % (s.key, i), 'out'),
            '--top',
            '3',
          ]
          + s.pipeline_options()
        ),
      )
    )

  events_dir = os.path.join(workdir, 'events')
  if any(w in workloads for w in EVENTS_WORKLOADS):
    log('generating %d events' % events_n)
    subprocess.run(
      [sys.executable, EVENTS, '--generate', events_dir, '--count', str(events_n)],
      check=True,
      env=child_env(),
    )

  def events_run(label, extra):
    return lambda s, i: (
      [
        sys.executable,
        TIMED,
        EVENTS,
        '--events',
        os.path.join(events_dir, 'events-*.jsonl'),
        '--users',
        os.path.join(events_dir, 'users.csv'),
        '--output',
        events_output(label, s, i),
      ]
      + s.pipeline_options()
      + extra
    )

  def events_output(label, s, i):
    return os.path.join(workdir, '%s-%s-%d' % (label, s.key, i), 'out')

  if 'events' in workloads:
    timed.append(
      (
        'events',
        'events.py: %d JSON events read, parsed, windowed '
        'sums + top 3, joined with 5 000 users, top 5 countries' % events_n,
        events_run('events', []),
      )
    )
  if 'events_streaming' in workloads:
    timed.append(
      (
        'events_streaming',
        'events.py as a streaming job '
        '(--streaming: watermarks, triggers and bundles as for an '
        'unbounded source)',
        events_run('events_streaming', ['--streaming']),
      )
    )

  names = [s.name for s in servers]  # table columns, even if one fails
  results = {}  # (workload, server) -> dict
  failures = []
  try:
    started = []
    if not (timed or 'tiny' in workloads):
      servers = []  # the suite starts its own runners
    for s in servers:
      try:
        s.start()
        started.append(s)
      except (RuntimeError, OSError) as e:
        log('SKIPPING %s: %s' % (s.name, e))
    servers = started

    # Runs interleave (every runner's first run, then every runner's
    # second...): these machines' speed drifts by tens of percent within
    # minutes, and a drift should not land on one runner.
    for label, _detail, builder in timed:
      runs = {
        s.name: {'times': [], 'walls': [], 'client': [], 'runner': [], 'ok': True} for s in servers
      }
      for i in range(repeats):
        for s in servers:
          r = runs[s.name]
          if not r['ok']:
            continue
          argv = builder(s, i)
          if isinstance(s, RefractRun):
            argv = s.wrap(argv)
          runner_before = s.cpu_seconds()
          tree_before = children_cpu_seconds()
          wall, ok, out = run_timed(argv, timeout)
          runner_after = s.cpu_seconds()
          dt = job_seconds(out)
          client_cpu = job_seconds(out, 'BENCH_JOB_CPU_SECONDS')
          runner_cpu = (
            runner_after - runner_before
            if runner_before is not None and runner_after is not None
            else None
          )
          if getattr(s, 'cpu_in_client_tree', False) and runner_cpu is not None:
            # `refract run`'s workers are forked from a process it starts
            # and waits for; the PrismRunner path's server is the client's
            # child: their CPU is in the client's tree, less the pipeline's
            # own process (imports and construction).
            client_total = job_seconds(out, 'BENCH_CLIENT_CPU_SECONDS')
            if client_total is not None:
              runner_cpu += children_cpu_seconds() - tree_before - client_total
          if dt is None:
            ok = False
          log(
            '%-16s %-18s run %d: %s job, %7.2f s client wall, CPU: client '
            '%s, runner %s %s'
            % (
              label,
              s.name,
              i + 1,
              '%7.2f s' % dt if dt is not None else '?',
              wall,
              '%.2f s' % client_cpu if client_cpu is not None else '?',
              '%.2f s' % runner_cpu if runner_cpu is not None else '?',
              'ok' if ok else 'FAILED',
            )
          )
          if not ok:
            r['ok'] = False
            failures.append((label, s.name, out[-3000:]))
            continue
          r['times'].append(dt)
          r['walls'].append(wall)
          if client_cpu is not None:
            r['client'].append(client_cpu)
          if runner_cpu is not None:
            r['runner'].append(runner_cpu)
      for s in servers:
        r = runs[s.name]
        ok_all = r['ok']
        results[(label, s.name)] = {
          'ok': ok_all,
          'runs_s': r['times'],
          'wall_runs_s': r['walls'],
          'median_s': (statistics.median(r['times']) if r['times'] and ok_all else None),
          'client_cpu_s': (statistics.median(r['client']) if r['client'] and ok_all else None),
          'runner_cpu_s': (statistics.median(r['runner']) if r['runner'] and ok_all else None),
        }
        if label in EVENTS_WORKLOADS and ok_all:
          results[(label, s.name)]['output'] = [
            output_digest(events_output(label, s, i) + '-' + part)
            for i in range(repeats)
            for part in ('categories', 'countries')
          ]

    if 'tiny' in workloads:
      for s in servers:
        if isinstance(s, RefractRun):
          continue
        dt, ok, out = run_timed(
          [sys.executable, '-c', TINY_CLIENT, str(tiny_n)] + s.pipeline_options(), timeout
        )
        lat = None
        for line in out.splitlines():
          if line.startswith('TINY_LATENCIES '):
            lat = json.loads(line[len('TINY_LATENCIES ') :])
        if not ok or lat is None:
          failures.append(('tiny', s.name, out[-3000:]))
          results[('tiny', s.name)] = {'ok': False}
          log('tiny      %-18s FAILED' % s.name)
          continue
        results[('tiny', s.name)] = {
          'ok': True,
          'total_s': dt,
          'runner_p50_s': percentile(lat['runner'], 0.5),
          'runner_p95_s': percentile(lat['runner'], 0.95),
          'client_p50_s': percentile(lat['client'], 0.5),
          'client_p95_s': percentile(lat['client'], 0.95),
          'latencies_s': lat,
        }
        log(
          'tiny      %-18s %d jobs in %.1f s: runner p50 %.0f ms, p95 %.0f '
          'ms; client p50 %.0f ms, p95 %.0f ms'
          % (
            s.name,
            len(lat['runner']),
            dt,
            1000 * percentile(lat['runner'], 0.5),
            1000 * percentile(lat['runner'], 0.95),
            1000 * percentile(lat['client'], 0.5),
            1000 * percentile(lat['client'], 0.95),
          )
        )
  finally:
    for s in servers:
      s.stop()

  # Beam's PrismRunnerTest suite: the suite starts its own runner per test
  # class (`BIN --job_port N`), so it needs no server of ours.
  if 'suite' in workloads:
    bins = [('Refract', args.refract)]
    if not args.no_python_server:
      bins.append(('Python job server', PYTHON_JOB_SERVER_BIN))
    if args.prism:
      bins.append(('Prism', args.prism))
    for name, binary in bins:
      env = dict(os.environ, REFRACT_SUITE_BAR='0')
      t0 = time.perf_counter()
      p = subprocess.run(
        [PRISM_SUITE, binary],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
      )
      dt = time.perf_counter() - t0
      out = p.stdout.decode('utf-8', 'replace')
      summary = [
        line for line in out.splitlines() if line.startswith('prism-suite: ') and 'passed' in line
      ]
      summary = summary[-1][len('prism-suite: ') :] if summary else '?'
      results[('suite', name)] = {'ok': True, 'median_s': dt, 'runs_s': [dt], 'summary': summary}
      log('suite     %-18s %7.1f s (%s)' % (name, dt, summary))

  # The table: each peer over Refract (LOOPBACK defaults), and each peer
  # over `refract run` (its worker processes) and the PrismRunner path
  # (the client starts Refract) where those ran.
  own = ('Refract', 'refract run', 'PrismRunner path')
  peers = [n for n in names if n not in own]
  bases = [b for b in own if b in names]

  def cell(v, fmt):
    return fmt % v if v is not None else 'failed'

  header = (
    ['workload'] + ['%s s' % n for n in names] + ['%s / %s' % (p, b) for b in bases for p in peers]
  )
  rows = []
  for label, _detail, _ in timed:
    row = [label]
    for n in names:
      r = results.get((label, n), {})
      row.append(cell(r.get('median_s'), '%.2f'))
    for b in bases:
      ref = results.get((label, b), {}).get('median_s')
      for p in peers:
        pv = results.get((label, p), {}).get('median_s')
        row.append('%.2fx' % (pv / ref) if pv and ref else '-')
    rows.append(row)
  if 'suite' in workloads:
    timed.append(('suite', 'Beam PrismRunnerTest suite wall time', None))
    row = ['suite']
    ref = results.get(('suite', 'Refract'), {}).get('median_s')
    for n in names:
      r = results.get(('suite', n), {})
      row.append(
        cell(r.get('median_s'), '%.1f') + (' (%s)' % r['summary'] if 'summary' in r else '')
      )
    for b in bases:
      for p in peers:
        pv = results.get(('suite', p), {}).get('median_s')
        row.append('%.2fx' % (pv / ref) if pv and ref and b == 'Refract' else '-')
    rows.append(row)
  if 'tiny' in workloads:
    for who, q in (('runner', 'p50'), ('runner', 'p95'), ('client', 'p50'), ('client', 'p95')):
      row = ['tiny %s %s ms' % (who, q)]
      key = '%s_%s_s' % (who, q)
      for n in names:
        v = results.get(('tiny', n), {}).get(key)
        row.append('-' if n == 'refract run' else cell(v * 1000 if v is not None else None, '%.0f'))
      for b in bases:
        ref = results.get(('tiny', b), {}).get(key)
        for p in peers:
          pv = results.get(('tiny', p), {}).get(key)
          row.append('%.2fx' % (pv / ref) if pv and ref else '-')
      rows.append(row)

  # Where the time went: the client's CPU over the job (with LOOPBACK
  # thread workers, the SDK's work, bound to one core by its interpreter
  # lock) and the job server's. A run at its ideal takes the client's CPU
  # time in wall time; the last column is how far each is from that.
  cpu_rows = []
  for label, _detail, builder in timed:
    if builder is None:
      continue
    for n in names:
      r = results.get((label, n), {})
      if r.get('median_s') is None:
        continue
      client, runner = r.get('client_cpu_s'), r.get('runner_cpu_s')
      if n == 'refract run':
        # Its SDK work is in worker processes, all cores' worth: the least
        # a run can take is their CPU (in the runner's) spread over the
        # cores. The fork server's import of Beam is counted too, though
        # it happens before the job, beside the pipeline's own start-up.
        ideal = runner / (os.cpu_count() or 1) if runner else None
        cpu_rows.append(
          [
            label,
            n,
            '%.2f' % r['median_s'],
            '-',
            cell(runner, '%.2f'),
            '%.2fx' % (r['median_s'] / ideal) if ideal else '-',
          ]
        )
        continue
      cpu_rows.append(
        [
          label,
          n,
          '%.2f' % r['median_s'],
          cell(client, '%.2f'),
          cell(runner, '%.2f'),
          '%.2fx' % (r['median_s'] / client) if client else '-',
        ]
      )

  widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
  print()
  print(
    'Refract benchmarks, %s, %d core(s), repeats=%d (seconds from '
    'Pipeline.run() to DONE, median; ratio > 1 means Refract is faster)'
    % (time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), os.cpu_count(), repeats)
  )
  for label, detail, _ in timed:
    print('  %-16s %s' % (label, detail))
  if 'tiny' in workloads:
    print(
      '  tiny      %d x Create(3)|Map|Count.Globally back to back in one '
      'client; runner = Prepare to terminal state, client = run() to '
      'wait_until_finish() returning' % tiny_n
    )
  print('| ' + ' | '.join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + ' |')
  print('|' + '|'.join('-' * (w + 2) for w in widths) + '|')
  for r in rows:
    print('| ' + ' | '.join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + ' |')

  if cpu_rows:
    cpu_header = ['workload', 'runner', 'job s', 'client CPU s', 'server CPU s', 'job / client CPU']
    cw = [max(len(r[i]) for r in [cpu_header] + cpu_rows) for i in range(len(cpu_header))]
    print()
    print(
      'CPU (medians; with LOOPBACK the SDK is the client: its CPU time '
      'is the least a run can take; under refract run the SDK is its '
      'worker processes, in the server column: that CPU over the cores '
      'is the least)'
    )
    for r in [cpu_header] + cpu_rows:
      print('| ' + ' | '.join(c.ljust(w) for c, w in zip(r, cw, strict=True)) + ' |')
      if r is cpu_header:
        print('|' + '|'.join('-' * (w + 2) for w in cw) + '|')

  # Both events workloads compute the same results: every run of either
  # must have written them.
  digests = {
    '%s on %s' % (label, n): results[(label, n)]['output']
    for label in EVENTS_WORKLOADS
    for n in names
    if results.get((label, n), {}).get('output')
  }
  if len({json.dumps(d) for d in digests.values()}) > 1:
    print('\nevents: the runs wrote DIFFERENT results: %s' % digests)
    failures.append(('events', 'the runners', 'results differ: %s' % digests))
  elif digests:
    print('\nevents: every run wrote the same results %s' % next(iter(digests.values()))[:2])

  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'%s|%s' % k: v for k, v in results.items()}, f, indent=1)

  for label, name, out in failures:
    print('\n== %s on %s failed; last output:\n%s' % (label, name, out[-1500:]), file=sys.stderr)
  return 1 if failures else 0


if __name__ == '__main__':
  sys.exit(main())
