#!/usr/bin/env python3
"""What a job on shard hosts costs each host, measured across virtual
hosts (network namespaces, netns_hosts.py): a coordinator and N shard hosts
(`refract shard`), each its own network stack on one switch, all sharing
this machine's cores. Needs root.

    integration/bench/shard_hosts.py --bin BIN [--hosts 3] [--elements 900000] [--repeats 3]

The workload is remote_pools.py's `gbk` pipeline (N numbers into 10 007
keys, a GroupByKey, a sum per key), its SDK workers started on each shard
host (PROCESS environments, python_boot.sh). Per run it prints:

- per shard host: the CPU of its `refract shard` process (utime + stime,
  workers not included) and the bytes its interface sent and took, both
  per million elements of the job;
- the coordinator's CPU per million elements (its Job API, the plan, the
  quiet detector, the hosts' reports; no element passes through it);
- and, with --kill, the time from a shard host killed mid-job (its
  processes SIGKILLed, as a host losing power) to the job running again
  on the others from its last checkpoint, read from the coordinator's
  log (the job then runs with --streaming, so that it is retried).

The coordinator keeps its jobs in a state directory, as in production, so
its numbers include taking the shards' checkpoint cuts.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'python'))
sys.path.insert(0, HERE)

# pylint: disable=wrong-import-position
from netns_hosts import VirtualHosts, available  # noqa: E402
from refract_testlib import read_log_tail  # noqa: E402
from remote_pools import PIPELINE  # noqa: E402

TICKS = os.sysconf('SC_CLK_TCK')
BOOT = os.path.join(os.path.dirname(HERE), 'python_boot.sh')
JOB_PORT = 8073
SHARD_PORT = 8100
EXCHANGE_PORT = 8200


def own_cpu_seconds(pid):
  """User + system CPU of `pid` itself (its children not included)."""
  try:
    with open('/proc/%d/stat' % pid) as f:
      fields = f.read().rsplit(')', 1)[1].split()
  except OSError:
    return 0.0
  return sum(int(x) for x in fields[11:13]) / TICKS


def link_bytes(host):
  """(sent, taken) bytes of `host`'s interface so far."""
  out = host.run(['cat', '/sys/class/net/eth0/statistics/tx_bytes'], check=True).stdout
  taken = host.run(['cat', '/sys/class/net/eth0/statistics/rx_bytes'], check=True).stdout
  return int(out), int(taken)


class Cluster:
  """The coordinator and its shard hosts on virtual hosts."""

  def __init__(self, hosts, binary, work, shard_names):
    self.hosts = hosts
    self.coord = hosts['coord']
    self.work = work
    self.log = os.path.join(work, 'coordinator.log')
    secret = os.path.join(work, 'secret')
    with open(secret, 'w') as f:
      f.write(os.urandom(24).hex())
    os.chmod(secret, 0o600)
    self.coordinator = self.coord.popen(
      [
        binary,
        'serve',
        '--host',
        self.coord.address,
        '--job_port',
        JOB_PORT,
        '--shard_listen',
        '%s:%d' % (self.coord.address, SHARD_PORT),
        '--shard_secret_file',
        secret,
        '--state_dir',
        os.path.join(work, 'state'),
        '--serve_http=false',
      ],
      log=self.log,
    )
    self.coord.wait_listening(JOB_PORT, self.coordinator)
    self.shards = {}
    for name in shard_names:
      host = hosts[name]
      self.shards[name] = host.popen(
        [
          binary,
          'shard',
          '--coordinator',
          '%s:%d' % (self.coord.address, SHARD_PORT),
          '--secret_file',
          secret,
          '--listen',
          '%s:%d' % (host.address, EXCHANGE_PORT),
          '--name',
          name,
          '--sdk_worker_parallelism',
          '1',
        ],
        log=os.path.join(work, '%s.log' % name),
      )
    deadline = time.monotonic() + 60
    while self.attached() < len(shard_names):
      if time.monotonic() > deadline:
        raise RuntimeError('shard hosts did not attach:\n' + read_log_tail(self.log))
      time.sleep(0.1)

  def attached(self):
    text = read_log_tail(self.log, 10**8)
    return text.count('a shard host attached') - text.count('a shard host detached')

  @property
  def endpoint(self):
    return '%s:%d' % (self.coord.address, JOB_PORT)

  def submit(self, elements, wait=True, streaming=False):
    """Runs the pipeline from the coordinator's host: its job id, once
    submitted (and once ended, with `wait`)."""
    out = os.path.join(self.work, 'out-%d' % time.monotonic_ns())
    argv = [
      sys.executable,
      '-c',
      PIPELINE,
      'gbk',
      str(elements),
      out,
      '--runner=PortableRunner',
      '--job_endpoint=' + self.endpoint,
      '--environment_type=PROCESS',
      '--environment_config=' + json.dumps({'command': BOOT}),
      '--experiments=disable_logging_submission_environment',
    ] + (['--streaming'] if streaming else [])
    if wait:
      done = self.coord.run(argv, timeout=900)
      if 'BENCH_JOB_SECONDS' not in done.stdout:
        why = '%s\n%s' % (done.stderr[-3000:], read_log_tail(self.log))
        raise RuntimeError('the job did not finish:\n' + why)
      return float(done.stdout.split('BENCH_JOB_SECONDS')[1].split()[0])
    return self.coord.popen(argv, log=os.path.join(self.work, 'client.log'))


def measure(cluster, elements):
  """One job: (wall s, coordinator CPU s, {host: (cpu s, sent, taken)})."""
  before_coord = own_cpu_seconds(cluster.coordinator.pid)
  before = {
    name: (own_cpu_seconds(proc.pid), link_bytes(cluster.hosts[name]))
    for name, proc in cluster.shards.items()
  }
  wall = cluster.submit(elements)
  coord_cpu = own_cpu_seconds(cluster.coordinator.pid) - before_coord
  per_host = {}
  for name, proc in cluster.shards.items():
    cpu0, (sent0, taken0) = before[name]
    sent, taken = link_bytes(cluster.hosts[name])
    per_host[name] = (own_cpu_seconds(proc.pid) - cpu0, sent - sent0, taken - taken0)
  return wall, coord_cpu, per_host


def recovery_after_kill(cluster, elements, victim):
  """Kills `victim` mid-job; seconds from the kill to the job placed on the
  hosts left (the coordinator's log says so), and the job's end state."""
  victim_log = os.path.join(cluster.work, '%s.log' % victim)
  runs_before = read_log_tail(victim_log, 10**8).count('running shards')
  client = cluster.submit(elements, wait=False, streaming=True)
  deadline = time.monotonic() + 120
  while read_log_tail(victim_log, 10**8).count('running shards') <= runs_before:
    if time.monotonic() > deadline:
      raise RuntimeError('the job did not start on %s' % victim)
    time.sleep(0.05)
  time.sleep(1.0)
  placed_before = read_log_tail(cluster.log, 10**8).count('a run placed on shard hosts')
  killed = time.monotonic()
  cluster.hosts[victim].kill_all()
  lost = None
  while time.monotonic() - killed < 120:
    text = read_log_tail(cluster.log, 10**8)
    if lost is None and 'trying again' in text[-20000:]:
      lost = time.monotonic() - killed
    if text.count('a run placed on shard hosts') > placed_before:
      break
    time.sleep(0.02)
  replaced = time.monotonic() - killed
  client.wait(timeout=600)
  return lost, replaced


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--bin', required=True)
  parser.add_argument('--hosts', type=int, default=3)
  parser.add_argument('--elements', type=int, default=900000)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--kill', action='store_true', help='also measure recovery after a kill')
  args = parser.parse_args()
  ok, why = available()
  if not ok:
    sys.exit('needs network namespaces: %s' % why)
  names = ['s%d' % (i + 1) for i in range(args.hosts)]
  print(
    '# shard_hosts.py, %s, %d elements, %d shard hosts'
    % (datetime.now().strftime('%Y-%m-%d %H:%M'), args.elements, args.hosts)
  )
  with tempfile.TemporaryDirectory(prefix='refract-bench-') as work:
    with VirtualHosts(['coord'] + names) as hosts:
      cluster = Cluster(hosts, args.bin, work, names)
      cluster.submit(10000)  # warm: the first job pays for imports
      runs = [measure(cluster, args.elements) for _ in range(args.repeats)]
      millions = args.elements / 1e6
      print(
        '| run | wall s | coordinator CPU s per 1M | per shard host: CPU s per 1M '
        '| MB sent per 1M | MB taken per 1M |'
      )
      print('|---|---:|---:|---|---|---|')
      for i, (wall, coord_cpu, per_host) in enumerate(runs):
        cpus = ' / '.join('%.2f' % (per_host[n][0] / millions) for n in names)
        sent = ' / '.join('%.1f' % (per_host[n][1] / 1e6 / millions) for n in names)
        taken = ' / '.join('%.1f' % (per_host[n][2] / 1e6 / millions) for n in names)
        row = (i + 1, wall, coord_cpu / millions, cpus, sent, taken)
        print('| %d | %.2f | %.3f | %s | %s | %s |' % row)
      walls = [r[0] for r in runs]
      print('median wall %.2f s' % statistics.median(walls))
      if args.kill:
        lost, replaced = recovery_after_kill(cluster, args.elements, names[-1])
        print(
          'killed %s mid-job: the coordinator failed the run %.2f s later and placed '
          'it on the others %.2f s after the kill' % (names[-1], lost or -1, replaced)
        )


if __name__ == '__main__':
  main()
