"""Several "hosts" on one machine, for tests of Refract across machines.

Each host is a Linux network namespace of its own with a veth into a
switch: another namespace holding a Linux bridge. Processes started in a
host see only its loopback and its one address on a private /24, so a
server there is reached by that address, as on another machine, and a
host can be made to fail the ways machines do: all its processes killed
at once (`kill_all`), or its cable pulled (`link_down`: packets to and from
it vanish, so TCP connections hang instead of being reset, which only
keepalives notice). The filesystem stays shared: tests may collect output
there, but nothing about the hosts' networking leaks into the root
namespace.

  ok, why = available()
  with VirtualHosts(['runner', 'h1', 'h2']) as hosts:
    pool = hosts['h1'].popen(['python', '-m', '...'], log=path)
    hosts['runner'].tcp_reachable(hosts['h1'].address, 50000)
    hosts['h1'].link_down()

Everything is named with a prefix `rfx<pid>-` (the creating process), so
concurrent runs do not clash and `sweep_stale()` can remove what a crashed
run left behind. Veths are created directly inside their namespaces (the
host's end is `eth0` there, the bridge's end `rfx<pid>-p<i>`): no
interface ever appears in the root namespace, even for a moment, and
deleting the namespaces removes every trace. Needs root and iproute2's `ip`.
"""

import ctypes
import ipaddress
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

IP = shutil.which('ip') or '/usr/sbin/ip'
PREFIX = 'rfx'
NETNS_DIR = '/run/netns'
BRIDGE = 'br0'
HOST_IFACE = 'eth0'
CLONE_NEWNET = 0x40000000
# Where the /24s come from: 10.213.X.0/24, X picked at random among those
# no route of the root namespace overlaps.
NETWORK_BASE = (10, 213)

_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args, check=True, timeout=30):
  """Runs `ip ARGS`; raises with ip's own message when it fails."""
  run = subprocess.run(
    [IP] + [str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False
  )
  if check and run.returncode != 0:
    raise RuntimeError(
      'ip %s failed (exit %d): %s' % (' '.join(map(str, args)), run.returncode, run.stderr.strip())
    )
  return run


def namespaces():
  """Names of the network namespaces `ip netns` knows."""
  run = _ip('netns', 'list', check=False)
  return [line.split()[0] for line in run.stdout.splitlines() if line.strip()]


def namespace_pids(ns):
  """Pids of the processes in namespace `ns` (none once it is gone)."""
  run = _ip('netns', 'pids', ns, check=False)
  return [int(p) for p in run.stdout.split() if p.isdigit()]


def kill_namespace_processes(ns, sig=signal.SIGKILL, timeout_s=10):
  """Sends `sig` to every process in `ns`; with SIGKILL, repeats (a
  process may fork meanwhile) until none is left or `timeout_s` passes.
  Returns the pids signalled."""
  signalled = set()
  deadline = time.monotonic() + timeout_s
  while True:
    pids = [p for p in namespace_pids(ns) if p != os.getpid()]
    if not pids:
      return signalled
    for pid in pids:
      try:
        os.kill(pid, sig)
        signalled.add(pid)
      except ProcessLookupError:
        pass
    if sig != signal.SIGKILL or time.monotonic() > deadline:
      return signalled
    time.sleep(0.05)


def available():
  """(True, '') if this process can make network namespaces; otherwise
  (False, why), for a test to skip with. Tries a throwaway namespace: being
  root is not enough inside some containers."""
  if os.geteuid() != 0:
    return False, 'network namespaces need root (euid is %d)' % os.geteuid()
  if not os.path.exists(IP):
    return False, 'iproute2\'s `ip` is not installed'
  probe = '%s%d-probe' % (PREFIX, os.getpid())
  try:
    made = _ip('netns', 'add', probe, check=False)
    if made.returncode != 0:
      return False, '`ip netns add` fails here: %s' % made.stderr.strip()
    up = _ip('-n', probe, 'link', 'set', 'lo', 'up', check=False)
    if up.returncode != 0:
      return False, 'cannot configure a new namespace: %s' % up.stderr.strip()
    return True, ''
  except (OSError, subprocess.SubprocessError) as e:
    return False, 'cannot run `ip`: %s' % e
  finally:
    _ip('netns', 'del', probe, check=False)


def _boot_time():
  with open('/proc/stat') as f:
    for line in f:
      if line.startswith('btime '):
        return int(line.split()[1])
  return 0


def _process_start_time(pid):
  """When process `pid` started (seconds since the epoch), or None if
  there is no such process."""
  try:
    with open('/proc/%d/stat' % pid) as f:
      fields = f.read().rsplit(')', 1)[1].split()
  except OSError:
    return None
  # Field 22 (starttime, in clock ticks since boot); fields[0] is field 3.
  return _boot_time() + int(fields[19]) / os.sysconf('SC_CLK_TCK')


def sweep_stale():
  """Removes the namespaces a crashed run left: those named `rfx<pid>-...`
  whose creating process is gone (or is a later process that reused the
  pid: one that started after the namespace was made). Their processes are
  killed first, since a namespace with processes outlives `ip netns del`.
  Returns the names removed."""
  removed = []
  for ns in namespaces():
    m = re.match(r'^%s(\d+)-' % PREFIX, ns)
    if not m:
      continue
    pid = int(m.group(1))
    if pid == os.getpid():
      continue
    started = _process_start_time(pid)
    try:
      made = os.stat(os.path.join(NETNS_DIR, ns)).st_mtime
    except OSError:
      made = None
    if started is not None and (made is None or started <= made + 1):
      continue  # its creator is still running
    kill_namespace_processes(ns)
    _ip('netns', 'del', ns, check=False)
    removed.append(ns)
  return removed


def _in_namespace(ns, fn):
  """Calls fn() in a thread that joined namespace `ns` first (setns
  changes only the calling thread's network namespace), so sockets it
  makes live there; returns what fn returned, or raises what it raised."""
  outcome = {}

  def run():
    try:
      fd = os.open(os.path.join(NETNS_DIR, ns), os.O_RDONLY)
      try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
          e = ctypes.get_errno()
          raise OSError(e, 'setns(%s): %s' % (ns, os.strerror(e)))
      finally:
        os.close(fd)
      outcome['value'] = fn()
    except BaseException as e:  # pylint: disable=broad-except
      outcome['error'] = e

  thread = threading.Thread(target=run, name='netns-' + ns, daemon=True)
  thread.start()
  thread.join()
  if 'error' in outcome:
    raise outcome['error']
  return outcome.get('value')


def _free_network():
  """A 10.213.X.0/24 that overlaps no route or address of the root
  namespace (so the hosts' traffic can never be confused with real
  traffic, and a second concurrent run most likely picks another)."""
  taken = []
  for args in (('-4', 'route', 'show', 'table', 'all'), ('-4', 'addr')):
    for word in _ip(*args, check=False).stdout.split():
      try:
        taken.append(ipaddress.ip_network(word, strict=False))
      except ValueError:
        pass
  for ns in namespaces():
    if ns.startswith(PREFIX):
      for word in _ip('-n', ns, '-4', 'addr', check=False).stdout.split():
        try:
          taken.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
          pass
  candidates = list(range(256))
  random.shuffle(candidates)
  for x in candidates:
    net = ipaddress.ip_network('%d.%d.%d.0/24' % (NETWORK_BASE + (x,)))
    if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
      return net
  raise RuntimeError('no free 10.213.X.0/24 network')


class Host:
  """One virtual host: a network namespace with an address on the switch.

  name       the host's name as the test gave it ('runner', 'h1', ...)
  namespace  its network namespace's name (prefixed)
  address    its IPv4 address (a string)
  """

  def __init__(self, hosts, name, namespace, address, port):
    self._hosts = hosts
    self.name = name
    self.namespace = namespace
    self.address = address
    self.port = port  # the bridge's end of its veth, in the switch
    self.processes = []
    self._logs = []

  def __repr__(self):
    return 'Host(%s, %s)' % (self.name, self.address)

  def argv(self, cmd):
    """`cmd` run in this host's network namespace."""
    return [IP, 'netns', 'exec', self.namespace] + [str(c) for c in cmd]

  def run(self, cmd, **kw):
    """subprocess.run of `cmd` in this host (output captured as text unless
    told otherwise)."""
    kw.setdefault('capture_output', True)
    kw.setdefault('text', True)
    kw.setdefault('check', False)
    kw.setdefault('stdin', subprocess.DEVNULL)
    return subprocess.run(self.argv(cmd), **kw)

  def popen(self, cmd, log=None, **kw):
    """Starts `cmd` in this host, in a session of its own (so it and its
    children can be ended as a group), stdout and stderr into the file
    `log` (default: discarded). The process is ended at teardown."""
    out = subprocess.DEVNULL
    if log is not None:
      out = open(log, 'ab')
      self._logs.append(out)
    kw.setdefault('stdin', subprocess.DEVNULL)
    kw.setdefault('stdout', out)
    kw.setdefault('stderr', subprocess.STDOUT)
    proc = subprocess.Popen(self.argv(cmd), start_new_session=True, **kw)
    proc.log_path = str(log) if log is not None else None
    self.processes.append(proc)
    return proc

  def pids(self):
    """Pids of every process in this host now."""
    return namespace_pids(self.namespace)

  def kill_all(self, sig=signal.SIGKILL):
    """Sends `sig` to every process in this host (as a host losing power
    would, with SIGKILL): those this object started and any they started.
    Returns the pids signalled."""
    signalled = kill_namespace_processes(self.namespace, sig)
    if sig == signal.SIGKILL:
      for proc in self.processes:
        try:
          proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
          pass
    return signalled

  def _set_link(self, state):
    _ip('-n', self._hosts.switch, 'link', 'set', self.port, state)
    _ip('-n', self.namespace, 'link', 'set', HOST_IFACE, state)

  def link_down(self):
    """Cuts this host off, as a pulled cable: its veth goes down on the
    bridge's side and on its own. Nothing answers for it (no RST, no ICMP
    from it), so connections to it hang until a keepalive or timeout gives
    up; its processes go on running, cut off too."""
    self._set_link('down')

  def link_up(self):
    """Plugs the cable back in (the connected route comes back with the
    interface)."""
    self._set_link('up')

  def in_namespace(self, fn):
    """Calls fn() with this host's network (see _in_namespace)."""
    return _in_namespace(self.namespace, fn)

  def connect(self, addr, port, timeout=3):
    """A TCP socket connected from this host to (addr, port); raises
    socket.timeout, ConnectionRefusedError, ... as connect does."""

    def go():
      return socket.create_connection((addr, port), timeout=timeout)

    return self.in_namespace(go)

  def tcp_reachable(self, addr, port, timeout=3):
    """Whether a TCP connection from this host to (addr, port) is accepted
    within `timeout` seconds."""
    try:
      self.connect(addr, port, timeout).close()
      return True
    except OSError:
      return False

  def wait_listening(self, port, proc=None, timeout_s=60, addr=None):
    """Waits until this host accepts TCP connections on (addr or its own
    address, port), failing early if `proc` exits. Seconds waited."""
    start = time.monotonic()
    addr = addr or self.address
    while not self.tcp_reachable(addr, port, timeout=1):
      if proc is not None and proc.poll() is not None:
        raise RuntimeError(
          '%s: %s exited with %s before listening on %s:%d%s'
          % (self.name, proc.args[4:], proc.returncode, addr, port, _tail(proc))
        )
      if time.monotonic() - start > timeout_s:
        raise RuntimeError(
          '%s: nothing listened on %s:%d within %ss%s'
          % (self.name, addr, port, timeout_s, _tail(proc))
        )
      time.sleep(0.2)
    return time.monotonic() - start

  def _close_logs(self):
    for f in self._logs:
      try:
        f.close()
      except OSError:
        pass
    self._logs = []


def _tail(proc, chars=3000):
  path = getattr(proc, 'log_path', None)
  if not path:
    return ''
  try:
    with open(path, 'rb') as f:
      text = f.read().decode('utf-8', 'replace')
  except OSError:
    return ''
  return '; log %s:\n%s' % (path, text[-chars:])


class VirtualHosts:
  """A switch and hosts named `names` (the first gets .1, the next .2, ...
  on a free 10.213.X.0/24), as a context manager that always tears all of
  it down: processes killed, veths, bridge and namespaces deleted, also
  when the test failed or setting up failed half-way. Entering it first
  sweeps what crashed runs left (`sweep_stale`) unless `sweep` is false.

    with VirtualHosts(['runner', 'h1', 'h2']) as hosts:
      hosts['h1'].address, hosts.network, list(hosts)
  """

  def __init__(self, names, prefix=None, sweep=True):
    if len(set(names)) != len(names):
      raise ValueError('host names must be distinct: %s' % names)
    self.prefix = prefix or '%s%d-' % (PREFIX, os.getpid())
    self.names = list(names)
    self.switch = self.prefix + 'sw'
    self.network = None
    self.hosts = {}
    self._made = []  # namespaces made, in order
    self._sweep = sweep

  def __getitem__(self, name):
    return self.hosts[name]

  def __iter__(self):
    return iter(self.hosts.values())

  def __enter__(self):
    try:
      self._build()
    except BaseException:
      self.teardown()
      raise
    return self

  def __exit__(self, *exc):
    self.teardown()
    return False

  def _add_namespace(self, ns):
    if os.path.exists(os.path.join(NETNS_DIR, ns)):
      # Left by an earlier process with our pid (a crash, pid reused).
      kill_namespace_processes(ns)
      _ip('netns', 'del', ns, check=False)
    _ip('netns', 'add', ns)
    self._made.append(ns)
    _ip('-n', ns, 'link', 'set', 'lo', 'up')

  def _build(self):
    if self._sweep:
      sweep_stale()  # what crashed runs left, before picking a network
    self.network = _free_network()
    addresses = list(self.network.hosts())
    self._add_namespace(self.switch)
    _ip('-n', self.switch, 'link', 'add', BRIDGE, 'type', 'bridge')
    _ip('-n', self.switch, 'link', 'set', BRIDGE, 'up')
    for i, name in enumerate(self.names):
      ns = self.prefix + name
      self._add_namespace(ns)
      # The bridge's end, named with the run's prefix (at most 15 bytes,
      # the kernel's limit) so a leak would be recognisable anywhere.
      port = '%sp%d' % (self.prefix, i)
      if len(port) > 15:
        port = ('p%d-%s' % (i, self.prefix))[:15]
      # Both ends made where they belong: nothing in the root namespace.
      _ip(
        'link',
        'add',
        'name',
        HOST_IFACE,
        'netns',
        ns,
        'type',
        'veth',
        'peer',
        'name',
        port,
        'netns',
        self.switch,
      )
      _ip('-n', self.switch, 'link', 'set', port, 'master', BRIDGE)
      _ip('-n', self.switch, 'link', 'set', port, 'up')
      address = str(addresses[i])
      _ip('-n', ns, 'addr', 'add', '%s/%d' % (address, self.network.prefixlen), 'dev', HOST_IFACE)
      _ip('-n', ns, 'link', 'set', HOST_IFACE, 'up')
      self.hosts[name] = Host(self, name, ns, address, port)

  def teardown(self):
    """Kills every process left in the hosts, deletes veths, bridge and
    namespaces. Safe to call twice; raises if something could not be
    removed (after trying everything)."""
    problems = []
    host_namespaces = [ns for ns in self._made if ns != self.switch]
    for ns in host_namespaces:
      kill_namespace_processes(ns)
      if namespace_pids(ns):
        problems.append('processes %s survive in %s' % (namespace_pids(ns), ns))
    for host in self.hosts.values():
      for proc in host.processes:
        try:
          proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
          problems.append('process %s did not end' % proc.pid)
      host._close_logs()  # pylint: disable=protected-access
    if self.switch in self._made:
      for host in self.hosts.values():
        _ip('-n', self.switch, 'link', 'del', host.port, check=False)
      _ip('-n', self.switch, 'link', 'del', BRIDGE, check=False)
      kill_namespace_processes(self.switch)
    for ns in reversed(self._made):
      run = _ip('netns', 'del', ns, check=False)
      if run.returncode != 0 and os.path.exists(os.path.join(NETNS_DIR, ns)):
        problems.append('ip netns del %s: %s' % (ns, run.stderr.strip()))
    self._made = []
    left = [ns for ns in namespaces() if ns.startswith(self.prefix)]
    if left:
      problems.append('namespaces left: %s' % left)
    if problems:
      raise RuntimeError('teardown of %s: %s' % (self.prefix, '; '.join(problems)))

  def leftovers(self):
    """Namespaces, and root-namespace interfaces, named with this run's
    prefix (empty after teardown)."""
    links = _ip('-o', 'link', 'show', check=False).stdout
    found = [ns for ns in namespaces() if ns.startswith(self.prefix)]
    found += [
      line.split(':')[1].strip().split('@')[0] for line in links.splitlines() if self.prefix in line
    ]
    return found
