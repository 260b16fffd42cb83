"""Refract's shard hosts placed by Ray: one `refract shard` per Ray node (or
one per CPU budget), as a Ray actor pinned to the node.

  python ray_shards.py --address ray://HEAD:PORT --refract PATH \\
      [--cpus_per_shard C] [--poll_interval S] -- SHARD_FLAGS...

SHARD_FLAGS are `refract shard`'s own (`--coordinator HOST:PORT
--secret_file FILE`, say): each actor runs `PATH shard SHARD_FLAGS --listen
NODE_IP:0 --name ray-NODE-K` on its node, so the binary and the secret file
must be there at those paths. A node with C CPUs or fewer gets one shard
host; with `--cpus_per_shard C`, a node gets one per C of its CPUs.

Ray does the placement and the failure detection: the driver looks at the
cluster every `--poll_interval` seconds, starts the actors a live node is
missing, and forgets those whose node left or whose actor died (their
`refract shard` dies with the actor's process, so its coordinator sees the
host go at once). A host whose process ended on a node that is still there
is started again.

What it prints on stdout, one JSON object a line (ray_pools.py's Events):

  {"event": "add", "host": "ray-NODE-K", "node": "<node id>"}
  {"event": "remove", "host": "ray-NODE-K", "node": "<node id>", "why": "..."}
  {"event": "error", "message": "..."}

It exits, and its actors with it, when its stdin reaches end of file or on
SIGTERM.
"""

import argparse
import logging
import os
import select
import signal
import sys
import time

import ray_pools

_LOG = logging.getLogger('ray_shards')
# A host that ended on a live node is started again after this long.
RESTART_AFTER_S = 2.0


class RefractShardHost:
  """A Ray actor running one `refract shard` on its node until it ends."""

  def __init__(self, refract, flags, name):
    self._argv = [refract, 'shard'] + list(flags) + ['--name', name]
    self._proc = None

  def serve(self):
    """Runs the host; returns its exit status when it ends."""
    import ctypes
    import signal as signals
    import subprocess

    import ray

    ip = ray.util.get_node_ip_address()

    def die_with_the_actor():
      # PR_SET_PDEATHSIG: the host dies with this actor's process, so a
      # killed actor or a lost node takes its shard host along.
      ctypes.CDLL(None).prctl(1, signals.SIGKILL)

    host = '[%s]' % ip if ':' in ip else ip
    self._proc = subprocess.Popen(
      self._argv + ['--listen', '%s:0' % host],
      stdin=subprocess.DEVNULL,
      preexec_fn=die_with_the_actor,
    )
    return self._proc.wait()

  def stop(self):
    if self._proc is not None and self._proc.poll() is None:
      self._proc.terminate()
      try:
        self._proc.wait(timeout=10)
      except Exception:  # pylint: disable=broad-except
        self._proc.kill()


class Placed:
  """One actor, from its start on a node until it is gone."""

  def __init__(self, node_id, name, actor):
    self.node_id = node_id
    self.name = name
    self.actor = actor
    self.done = actor.serve.remote()


class ShardHosts:
  """The shard hosts of all alive nodes, brought up to date by `poll`."""

  def __init__(self, ray, events, args):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    self._ray = ray
    self._events = events
    self._refract = args.refract
    self._flags = args.shard_flags
    self._cpus_per_shard = args.cpus_per_shard
    self._actor_class = ray.remote(RefractShardHost)
    self._affinity = NodeAffinitySchedulingStrategy
    self._placed = {}
    self._restart_at = {}

  def poll(self):
    alive = {n['NodeID']: n for n in self._ray.nodes() if n['Alive']}
    for placed in [p for p in self._placed.values() if p.node_id not in alive]:
      self._end(placed, 'its node left the cluster')
    self._reap_ended()
    now = time.monotonic()
    for node_id, node in alive.items():
      for k in range(self._wanted(node)):
        name = 'ray-%s-%d' % (node_id[:8], k)
        if name not in self._placed and self._restart_at.get(name, 0) <= now:
          self._start(node_id, name)

  def stop(self):
    placed = list(self._placed.values())
    self._placed.clear()
    if placed:
      self._ray.wait([p.actor.stop.remote() for p in placed], num_returns=len(placed), timeout=5)
    for p in placed:
      self._kill(p)

  def _wanted(self, node):
    if not self._cpus_per_shard:
      return 1
    cpus = int(node['Resources'].get('CPU', 0))
    return max(1, cpus // self._cpus_per_shard)

  def _start(self, node_id, name):
    actor = self._actor_class.options(
      num_cpus=0,
      max_concurrency=2,
      scheduling_strategy=self._affinity(node_id, soft=False),
    ).remote(self._refract, self._flags, name)
    self._placed[name] = Placed(node_id, name, actor)
    _LOG.info('starting shard host %s on node %s', name, node_id)
    self._events.emit('add', host=name, node=node_id)

  def _reap_ended(self):
    refs = {p.done: p for p in self._placed.values()}
    if not refs:
      return
    ended, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=0)
    for ref in ended:
      placed = refs[ref]
      try:
        why = 'it exited with status %s' % self._ray.get(ref)
      except Exception as e:  # pylint: disable=broad-except
        why = 'its actor died: %s' % ray_pools.summary(e)
      self._restart_at[placed.name] = time.monotonic() + RESTART_AFTER_S
      self._end(placed, why)

  def _end(self, placed, why):
    self._placed.pop(placed.name, None)
    self._kill(placed)
    _LOG.info('shard host %s on node %s gone: %s', placed.name, placed.node_id, why)
    self._events.emit('remove', host=placed.name, node=placed.node_id, why=why)

  def _kill(self, placed):
    try:
      self._ray.kill(placed.actor)
    except Exception as e:  # pylint: disable=broad-except
      _LOG.debug('killing the actor of %s: %s', placed.name, e)


def follow(hosts, poll_interval):
  """Polls the cluster every `poll_interval` seconds until stdin's end."""
  while True:
    hosts.poll()
    readable, _, _ = select.select([0], [], [], poll_interval)
    if readable and not os.read(0, 65536):
      _LOG.info('stdin closed: stopping')
      return


def run(args):
  events = ray_pools.Events()
  signal.signal(signal.SIGTERM, ray_pools.raise_stop)
  try:
    ray = ray_pools.connect(args.address, events)
  except (ray_pools.Stop, KeyboardInterrupt):
    return 0
  except Exception as e:  # pylint: disable=broad-except
    events.error('cannot connect to Ray at %s: %s' % (args.address, e))
    return 1
  signal.signal(signal.SIGTERM, ray_pools.raise_stop)
  hosts = ShardHosts(ray, events, args)
  code = 0
  try:
    follow(hosts, args.poll_interval)
  except (ray_pools.Stop, KeyboardInterrupt) as e:
    _LOG.info('stopping: %s', e or 'interrupted')
  except Exception as e:  # pylint: disable=broad-except
    _LOG.exception('following the Ray cluster failed')
    events.error('following the Ray cluster failed: %s' % e)
    code = 1
  ray_pools.exit_soon(code)
  try:
    hosts.stop()
    ray.shutdown()
  except (ray_pools.Stop, KeyboardInterrupt):
    pass
  return code


def parse_args(argv):
  parser = argparse.ArgumentParser(description='Refract shard hosts on Ray nodes.')
  parser.add_argument('--address', required=True, help='Ray address: ray://HOST:PORT, HOST:PORT')
  parser.add_argument('--refract', required=True, help='the refract binary, at this path on nodes')
  parser.add_argument(
    '--cpus_per_shard', type=int, default=0, help='one shard host per this many CPUs of a node'
  )
  parser.add_argument('--poll_interval', type=float, default=2.0)
  parser.add_argument('shard_flags', nargs=argparse.REMAINDER, help='-- refract shard flags')
  args = parser.parse_args(argv)
  if args.shard_flags and args.shard_flags[0] == '--':
    args.shard_flags = args.shard_flags[1:]
  if not any(f.startswith('--coordinator') for f in args.shard_flags):
    parser.error('the shard flags after -- need --coordinator HOST:PORT')
  return args


def main(argv):
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(logging.Formatter('ray_shards %(levelname)s %(message)s'))
  _LOG.addHandler(handler)
  _LOG.setLevel(logging.INFO)
  _LOG.propagate = False
  return run(parse_args(argv[1:]))


if __name__ == '__main__':
  sys.exit(main(sys.argv))
