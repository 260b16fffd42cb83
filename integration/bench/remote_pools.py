#!/usr/bin/env python3
"""Remote worker pools on one machine: what they cost, and what one
Refract core can feed.

    integration/bench/remote_pools.py --bin BIN [--repeats 3] [--json FILE]

Needs root (network namespaces, as integration/python/netns_hosts.py makes
them) and the project's virtualenv. Three virtual hosts on one bridge: the
runner, and two pool hosts each running Beam's Python worker pool with
integration/python_boot.sh as its container executable (so workers fetch
their options and staged files over the Fn API). Each workload runs, in
turn, on

  local   `refract serve`: Python's default DOCKER environment run as
          two local processes by the runner;
  remote  `refract serve --worker_pool python=h1 --worker_pool python=h2`:
          one worker on each pool host;

each client asking for two workers (`--sdk_worker_parallelism=2`; Python
sends 1 otherwise, which a local environment keeps to).

Same two cores, same two workers: the difference is the network path, the
pools and the boot program. Per run it records the job's wall time (the
client's `run()` to DONE), the runner's CPU time and the SDK workers' CPU
time (from /proc: the runner's reaped children for local workers, the
pools' reaped children for remote ones). From those: runner CPU per
million elements, and SDK cores one runner core keeps busy (SDK CPU over
runner CPU). Then, once each: the time from killing a pool host's
processes (SIGKILL), and from cutting its link, mid-job to the runner
retrying the bundles lost there (its log's "bundle failed; retrying").
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
INTEGRATION = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(INTEGRATION, 'python'))

import netns_hosts  # noqa: E402  # pylint: disable=wrong-import-position

BOOT = os.path.join(INTEGRATION, 'python_boot.sh')
PYTHON = sys.executable
JOB_PORT = 8099
POOL_PORT = 50100
TICKS = os.sysconf('SC_CLK_TCK')

# The workloads: a Beam pipeline over `n` generated records, run by
# `python -c PIPELINE n ARGS...`; it prints the job's wall time.
PIPELINE = r'''
import sys, time
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
workload, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
p = beam.Pipeline(options=PipelineOptions(sys.argv[4:]))
numbers = p | beam.Create(range(0, n, 10000)) | beam.FlatMap(
    lambda start, n=n: range(start, min(start + 10000, n)))
if workload == 'gbk':
  result = (numbers | beam.Map(lambda i: (i % 10007, i)) | beam.GroupByKey()
            | beam.MapTuple(lambda k, vs: sum(vs)))
elif workload == 'combine':
  result = (numbers | beam.Map(lambda i: (i % 101, i))
            | beam.CombinePerKey(sum) | beam.Values())
else:  # pardo: four fused steps
  result = (numbers | 'Times3' >> beam.Map(lambda i: i * 3)
            | beam.Filter(lambda i: i % 7) | 'Plus1' >> beam.Map(lambda i: i + 1)
            | 'Mod' >> beam.Map(lambda i: i % 1000))
_ = (result | beam.CombineGlobally(sum) | beam.Map(str)
     | beam.io.WriteToText(out, shard_name_template=''))
start = time.perf_counter()
state = p.run().wait_until_finish()
print('BENCH_JOB_SECONDS %.3f %s' % (time.perf_counter() - start, state))
'''

SLOW = r'''
import sys, time
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
p = beam.Pipeline(options=PipelineOptions(sys.argv[1:]))
_ = (p | beam.Create(range(600)) | beam.Reshuffle()
     | beam.Map(lambda i: (time.sleep(0.05), i)[1])
     | beam.Map(lambda i: (i % 7, i)) | beam.GroupByKey()
     | beam.MapTuple(lambda k, vs: sum(vs)) | beam.CombineGlobally(sum)
     | beam.Map(print))
p.run().wait_until_finish()
'''


def cpu_seconds(pid):
  """User + system CPU of `pid` and its reaped children (0 once gone)."""
  try:
    with open('/proc/%d/stat' % pid) as f:
      fields = f.read().rsplit(')', 1)[1].split()
  except OSError:
    return 0.0
  return sum(int(x) for x in fields[11:15]) / TICKS


def child_cpu_seconds(pid):
  """User + system CPU of `pid`'s reaped children only."""
  try:
    with open('/proc/%d/stat' % pid) as f:
      fields = f.read().rsplit(')', 1)[1].split()
  except OSError:
    return 0.0
  return sum(int(x) for x in fields[13:15]) / TICKS


class Setup:
  """The virtual hosts, the pools on h1 and h2, and a runner in `runner`."""

  def __init__(self, hosts, binary, work):
    self.hosts, self.bin, self.work = hosts, binary, work
    self.env = dict(os.environ)
    self.env['PATH'] = os.path.dirname(PYTHON) + os.pathsep + self.env['PATH']
    boot = os.path.join(work, 'pool_boot.sh')
    with open(boot, 'w') as f:
      f.write('#!/bin/sh\nexec %s "$@" 1>&2\n' % BOOT)
    os.chmod(boot, 0o755)
    self.pools = {}
    for name in ('h1', 'h2'):
      host = hosts[name]
      proc = host.popen(
        [
          PYTHON,
          '-m',
          'apache_beam.runners.worker.worker_pool_main',
          '--service_port=%d' % POOL_PORT,
          '--container_executable=' + boot,
        ],
        log=os.path.join(work, 'pool-%s.log' % name),
        env=self.env,
      )
      host.wait_listening(POOL_PORT, proc, timeout_s=90)
      self.pools[name] = proc

  def serve(self, remote, log_name):
    runner = self.hosts['runner']
    cmd = [
      self.bin,
      'serve',
      '--job_port',
      str(JOB_PORT),
      '--serve_http=false',
      '--sdk_python',
      PYTHON,
      '--sdk_worker_parallelism',
      '2',
      '--host',
      '0.0.0.0',
      '--fn_api_host',
      runner.address,
    ]
    if remote:
      for name in ('h1', 'h2'):
        cmd += ['--worker_pool', 'python=%s:%d' % (self.hosts[name].address, POOL_PORT)]
    log = os.path.join(self.work, log_name)
    proc = runner.popen(cmd, log=log, env=self.env)
    runner.wait_listening(JOB_PORT, proc, timeout_s=60, addr='127.0.0.1')
    return proc, log

  def client(self, code, args, timeout_s=900):
    return self.hosts['runner'].run([PYTHON, '-c', code] + args, env=self.env, timeout=timeout_s)

  def sdk_cpu(self, server, remote):
    if remote:
      return sum(child_cpu_seconds(p.pid) for p in self.pools.values())
    return child_cpu_seconds(server.pid)


def stop(proc):
  try:
    os.killpg(proc.pid, 15)
  except ProcessLookupError:
    pass
  try:
    proc.wait(timeout=20)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, 9)
    proc.wait()


def run_workloads(setup, workloads, repeats):
  rows = []
  portable = [
    '--runner=PortableRunner',
    '--job_endpoint=localhost:%d' % JOB_PORT,
    '--sdk_worker_parallelism=2',
    '--experiments=disable_logging_submission_environment',
  ]
  for remote in (False, True):
    config = 'remote' if remote else 'local'
    server, _ = setup.serve(remote, 'refract-%s.log' % config)
    try:
      for workload, n in workloads:
        for r in range(repeats):
          out = os.path.join(setup.work, '%s-%s-%d.txt' % (workload, config, r))
          runner0 = cpu_seconds(server.pid) - child_cpu_seconds(server.pid)
          sdk0 = setup.sdk_cpu(server, remote)
          done = setup.client(PIPELINE, [workload, str(n), out] + portable)
          runner1 = cpu_seconds(server.pid) - child_cpu_seconds(server.pid)
          sdk1 = setup.sdk_cpu(server, remote)
          m = re.search(r'BENCH_JOB_SECONDS ([0-9.]+) (\S+)', done.stdout)
          if not m or 'DONE' not in m.group(2):
            raise RuntimeError('%s %s failed:\n%s' % (workload, config, done.stderr[-3000:]))
          with open(out) as f:
            total = int(f.read().strip())
          rows.append(
            {
              'workload': workload,
              'elements': n,
              'config': config,
              'run': r,
              'job_s': float(m.group(1)),
              'result': total,
              'runner_cpu_s': runner1 - runner0,
              'sdk_cpu_s': sdk1 - sdk0,
            }
          )
          print(json.dumps(rows[-1]), flush=True)
    finally:
      stop(server)
  return rows


def host_loss(setup, fault):
  """Seconds from a fault of h1 mid-job — `kill` (SIGKILL of every process
  there) or `cut` (its link down) — to the runner retrying the bundles it
  lost, and whether the job still ended DONE."""
  server, log = setup.serve(True, 'refract-%s.log' % fault)
  host = setup.hosts['h1']
  try:
    client = setup.hosts['runner'].popen(
      [
        PYTHON,
        '-c',
        SLOW,
        '--runner=PortableRunner',
        '--job_endpoint=localhost:%d' % JOB_PORT,
        '--experiments=disable_logging_submission_environment',
      ],
      log=os.path.join(setup.work, 'loss-%s-client.log' % fault),
      env=setup.env,
    )
    # Mid-job: both workers connected, and some seconds of sleeping done.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
      with open(log) as f:
        if f.read().count('worker connected') >= 2:
          break
      time.sleep(0.2)
    time.sleep(5)
    fault_at = datetime.utcnow()
    if fault == 'kill':
      host.kill_all()
    else:
      host.link_down()
    client.wait(timeout=600)
    with open(log) as f:
      text = f.read()
  finally:
    if fault == 'cut':
      host.link_up()
    stop(server)
  retries = [
    datetime.strptime(t[:26], '%Y-%m-%dT%H:%M:%S.%f')
    for t in re.findall(r'^(\S+)Z .*bundle failed; retrying', text, re.M)
  ]
  after = [r for r in retries if r > fault_at]
  return {
    'fault': fault,
    'retry_after_fault_s': round((after[0] - fault_at).total_seconds(), 2) if after else None,
    'job_done': client.returncode == 0,
  }


def summarize(rows):
  print()
  print(
    '| workload | config | job s | runner CPU s | SDK CPU s | '
    'runner CPU s per 1M elements | SDK cores per runner core |'
  )
  print('|---|---|---|---|---|---|---|')
  by = {}
  for r in rows:
    by.setdefault((r['workload'], r['config'], r['elements']), []).append(r)
  medians = {}
  for (workload, config, n), runs in by.items():

    def med(k, runs=runs):
      return statistics.median(x[k] for x in runs)

    job, runner, sdk = med('job_s'), med('runner_cpu_s'), med('sdk_cpu_s')
    medians[(workload, config)] = job
    print(
      '| %s, %dk | %s | %.2f | %.2f | %.2f | %.2f | %s |'
      % (
        workload,
        n // 1000,
        config,
        job,
        runner,
        sdk,
        runner / n * 1e6,
        '%.0f' % (sdk / runner) if runner > 0 else '-',
      )
    )
  print()
  for (workload, config), job in medians.items():
    if config == 'remote':
      local = medians.get((workload, 'local'))
      if local:
        print('%s: remote / local = %.2f' % (workload, job / local))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--bin', required=True)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--json')
  parser.add_argument(
    '--scale', type=float, default=1.0, help='multiplies every workload\'s element count'
  )
  args = parser.parse_args()
  ok, why = netns_hosts.available()
  if not ok:
    sys.exit('remote_pools.py needs network namespaces: %s' % why)
  workloads = [
    (w, int(n * args.scale)) for w, n in (('gbk', 300000), ('combine', 1000000), ('pardo', 1000000))
  ]
  work = tempfile.mkdtemp(prefix='refract-remote-bench.')
  os.chmod(work, 0o755)
  print('logs in', work, flush=True)
  with netns_hosts.VirtualHosts(['runner', 'h1', 'h2']) as hosts:
    setup = Setup(hosts, os.path.abspath(args.bin), work)
    rows = run_workloads(setup, workloads, args.repeats)
    loss = [host_loss(setup, 'kill')]
    # The killed pool comes back for the second fault.
    setup.pools['h1'] = setup.hosts['h1'].popen(
      [
        PYTHON,
        '-m',
        'apache_beam.runners.worker.worker_pool_main',
        '--service_port=%d' % POOL_PORT,
        '--container_executable=' + os.path.join(work, 'pool_boot.sh'),
      ],
      log=os.path.join(work, 'pool-h1-again.log'),
      env=setup.env,
    )
    setup.hosts['h1'].wait_listening(POOL_PORT, setup.pools['h1'], 90)
    loss.append(host_loss(setup, 'cut'))
  summarize(rows)
  for result in loss:
    print('host loss:', json.dumps(result))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'runs': rows, 'host_loss': loss}, f, indent=1)


if __name__ == '__main__':
  main()
