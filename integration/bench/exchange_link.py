"""The exchange between two shards on two hosts: one exchange_peer
(runner/exchange/examples) in each of two network namespaces joined by a
virtual link (a veth pair each, through a bridge), one sending the other
deliveries of one size as fast as the exchange's credit lets it; prints
the throughput and each side's CPU per GiB, by delivery size.

    integration/bench/exchange_link.py [--gib 1] [--sizes 4096,65536,1048576]

Needs root and iproute2 (as the tests' virtual hosts do). Builds the peer
with cargo (release, in $CARGO_TARGET_DIR). Two cores run both hosts, the
kernel's link between them, and both processes' gRPC: a lower bound of
what two machines would do, and each side's CPU per GiB is the cost a
shard pays to send or take its share of a shuffle.
"""

import argparse
import json
import os
import secrets
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'python'))

# pylint: disable=wrong-import-position
from netns_hosts import VirtualHosts, available  # noqa: E402
from refract_testlib import stat_fields  # noqa: E402

PORT = 47000


def build_peer():
  """Builds the exchange peer example; its path."""
  subprocess.run(
    ['cargo', 'build', '--release', '-q', '-p', 'refract-exchange', '--example', 'exchange_peer'],
    cwd=REPO,
    check=True,
  )
  target = os.environ.get('CARGO_TARGET_DIR', os.path.join(REPO, 'target'))
  return os.path.join(target, 'release', 'examples', 'exchange_peer')


def cpu_seconds(pid):
  """utime + stime of process `pid`, in seconds (USER_HZ ticks of 10 ms)."""
  fields = stat_fields(pid)
  return (int(fields[11]) + int(fields[12])) / 100.0


def one_size(hosts, peer, size, total, work):
  """Sends `total` bytes in deliveries of `size` from host a to host b."""
  a, b = hosts['a'], hosts['b']
  sender, receiver = '%s:%d' % (a.address, PORT), '%s:%d' % (b.address, PORT)
  common = ['--sender', sender, '--receiver', receiver, '--key', secrets.token_hex(16)]
  common += ['--size', str(size), '--bytes', str(total)]
  log = os.path.join(work, 'peer-%d' % size)
  taking = b.popen([peer, 'receive', '--listen', receiver] + common, log=log + '-b.log')
  b.wait_listening(PORT, proc=taking)
  sending = a.popen([peer, 'send', '--listen', sender] + common, log=log + '-a.log')
  before = cpu_seconds(sending.pid)
  started = time.monotonic()
  try:
    taking.wait(timeout=600)
  finally:
    sent_cpu = cpu_seconds(sending.pid) - before
    wall = time.monotonic() - started
    sending.kill()
    sending.wait()
  with open(log + '-b.log') as f:
    lines = [line for line in f if line.startswith('{')]
  if taking.returncode != 0 or not lines:
    with open(log + '-b.log') as f:
      raise RuntimeError('the receiver failed:\n' + f.read()[-3000:])
  got = json.loads(lines[-1])
  gib = total / float(1 << 30)
  return {
    'size': size,
    'mib_per_s': total / float(1 << 20) / got['seconds'],
    'deliveries_per_s': total / size / got['seconds'],
    'send_cpu_per_gib': sent_cpu / gib,
    'take_cpu_per_gib': got['cpu_seconds'] / gib,
    'wall': wall,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--gib', type=float, default=1.0)
  parser.add_argument('--sizes', default='4096,65536,1048576')
  args = parser.parse_args()
  ok, why = available()
  if not ok:
    sys.exit('exchange_link: no virtual hosts here: %s' % why)
  peer = build_peer()
  total = int(args.gib * (1 << 30))
  rows = []
  work = os.path.join('/tmp', 'refract-exchange-link-%d' % os.getpid())
  os.makedirs(work, exist_ok=True)
  with VirtualHosts(['a', 'b']) as hosts:
    for size in [int(s) for s in args.sizes.split(',')]:
      rows.append(one_size(hosts, peer, size, total - total % size, work))
  print('| delivery bytes | MiB/s | deliveries/s | sender CPU s per GiB | receiver CPU s per GiB |')
  print('|---:|---:|---:|---:|---:|')
  for r in rows:
    print(
      '| %d | %.0f | %.0f | %.2f | %.2f |'
      % (
        r['size'],
        r['mib_per_s'],
        r['deliveries_per_s'],
        r['send_cpu_per_gib'],
        r['take_cpu_per_gib'],
      )
    )


if __name__ == '__main__':
  main()
