"""The virtual hosts of netns_hosts.py behave like machines on a LAN.

test_remote_pools.py trusts them to: a server in one host is reached from
another by its address (and not from the root namespace), killing a host's
processes resets their connections while pulling its cable makes them hang
(only keepalives can tell), the cable can be plugged back, and nothing is
left behind: not after a test, not after a test that failed, and what a
crashed run left is swept.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import netns_hosts

AVAILABLE, WHY_NOT = netns_hosts.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY_NOT or 'n/a')

ECHO_PORT = 7007
# An echo server: each connection gets back what it sends, until it closes.
ECHO_SERVER = r'''
import socket, sys, threading
def serve(conn):
  with conn:
    while True:
      data = conn.recv(4096)
      if not data:
        return
      conn.sendall(data)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', int(sys.argv[1])))
s.listen()
print('listening', flush=True)
while True:
  conn, _ = s.accept()
  threading.Thread(target=serve, args=(conn,), daemon=True).start()
'''


def echo(host, addr, payload=b'ping', timeout=3):
  """Sends `payload` from `host` to the echo server at `addr` and returns
  the answer."""

  def go():
    with socket.create_connection((addr, ECHO_PORT), timeout=timeout) as s:
      s.sendall(payload)
      return s.recv(4096)

  return host.in_namespace(go)


def start_echo(host, tmp_path):
  proc = host.popen(
    [sys.executable, '-c', ECHO_SERVER, ECHO_PORT], log=tmp_path / ('echo-%s.log' % host.name)
  )
  host.wait_listening(ECHO_PORT, proc, timeout_s=30)
  return proc


def test_hosts_reach_each_other_and_a_cut_host_hangs(tmp_path):
  with netns_hosts.VirtualHosts(['runner', 'h1', 'h2']) as hosts:
    runner, h1, h2 = hosts['runner'], hosts['h1'], hosts['h2']
    assert len({h.address for h in hosts}) == 3
    start_echo(h1, tmp_path)

    assert echo(runner, h1.address) == b'ping'
    assert echo(h2, h1.address, b'from h2') == b'from h2'
    # Only h1 listens, and only h1's own loopback is h1's.
    assert not runner.tcp_reachable('127.0.0.1', ECHO_PORT, timeout=1)
    assert not runner.tcp_reachable(h2.address, ECHO_PORT, timeout=1)
    # The root namespace is not on the hosts' network: no address there,
    # no route but the default one. (Not a connect: a sandbox's proxy may
    # accept any outgoing connection.)
    root = subprocess.run(['ip', '-4', '-o', 'addr'], capture_output=True, text=True).stdout
    assert str(hosts.network.network_address)[:-1] not in root, root
    route = subprocess.run(
      ['ip', 'route', 'get', h1.address], capture_output=True, text=True
    ).stdout
    assert ' via ' in route, route  # not a directly connected network

    # A connection made before the cut hangs after it: no reset, no answer.
    established = runner.connect(h1.address, ECHO_PORT)
    established.sendall(b'before')
    assert established.recv(100) == b'before'
    h1.link_down()
    established.settimeout(2)
    established.sendall(b'after')
    started = time.monotonic()
    with pytest.raises(socket.timeout):
      established.recv(100)
    assert time.monotonic() - started >= 1.9
    # A new connection is not refused either: it gets no answer at all
    # (a timeout; once the neighbour entry expires, after ~3 s, Linux says
    # "no route to host", as for a dead machine on a LAN).
    started = time.monotonic()
    with pytest.raises(OSError) as failure:
      runner.connect(h1.address, ECHO_PORT, timeout=2).close()
    assert not isinstance(failure.value, ConnectionRefusedError), failure.value
    assert isinstance(failure.value, socket.timeout) or (
      getattr(failure.value, 'errno', None) == 113
    ), failure.value
    assert time.monotonic() - started >= 1.9 or failure.value.errno == 113
    # The rest of the network is untouched.
    start_echo(h2, tmp_path)
    assert echo(runner, h2.address) == b'ping'

    # Plugged back in, h1 answers again, on a new connection.
    h1.link_up()
    deadline = time.monotonic() + 10
    while not runner.tcp_reachable(h1.address, ECHO_PORT, timeout=1):
      assert time.monotonic() < deadline, 'h1 unreachable after link_up'
      time.sleep(0.2)
    assert echo(runner, h1.address, b'again') == b'again'
    established.close()

    # Killed, h1's processes are gone and its stack resets connections.
    killed = h1.kill_all()
    assert killed and not h1.pids()
    with pytest.raises(ConnectionRefusedError):
      runner.connect(h1.address, ECHO_PORT, timeout=2)
    assert h2.pids(), 'h2 lost processes when h1 was killed'
    prefix = hosts.prefix
    namespaces = [h.namespace for h in hosts] + [hosts.switch]
  assert hosts.leftovers() == []
  left = [ns for ns in netns_hosts.namespaces() if ns.startswith(prefix)]
  assert left == [] and not set(namespaces) & set(netns_hosts.namespaces())
  links = subprocess.run(['ip', '-o', 'link'], capture_output=True, text=True).stdout
  assert prefix not in links, links


def test_teardown_after_a_failure_leaves_nothing(tmp_path):
  hosts = netns_hosts.VirtualHosts(['runner', 'h1'])
  with pytest.raises(ZeroDivisionError):
    with hosts:
      # A process that ignores SIGTERM and has a child: both must go.
      hosts['h1'].popen(
        ['sh', '-c', 'trap "" TERM; sleep 600 & sleep 600'], log=tmp_path / 'stubborn.log'
      )
      time.sleep(0.3)
      assert len(hosts['h1'].pids()) >= 2
      # Fails inside the block on purpose: teardown must still clean up.
      _ = 1 / 0
  assert hosts.leftovers() == []


def dead_pid():
  """A pid no process has now (that of a child that has just exited)."""
  child = subprocess.Popen(['true'])
  child.wait()
  assert not os.path.exists('/proc/%d' % child.pid)
  return child.pid


def test_sweep_removes_what_a_crashed_run_left(tmp_path):
  stale = netns_hosts.VirtualHosts(['h1'], prefix='rfx%d-' % dead_pid(), sweep=False)
  stale.__enter__()  # pylint: disable=unnecessary-dunder-call
  try:
    sleeper = stale['h1'].popen(['sleep', '600'], log=tmp_path / 'sleep.log')
    ours = netns_hosts.VirtualHosts(['h1'], sweep=False)
    with ours:
      removed = netns_hosts.sweep_stale()
      # (Other crashed runs' namespaces may go too.)
      assert {stale.switch, stale['h1'].namespace} <= set(removed), removed
      # The sweep spares a live run's namespaces.
      assert ours['h1'].namespace in netns_hosts.namespaces()
      assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert not [ns for ns in netns_hosts.namespaces() if ns.startswith(stale.prefix)]
  finally:
    stale.teardown()
