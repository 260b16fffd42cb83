"""The command lines Beam uses to start a runner binary must work as-is."""

import os
import signal
import stat
import time

import pytest

from refract_testlib import RefractServer
from refract_testlib import free_port


@pytest.mark.parametrize(
  'flags',
  [
    # Beam's PrismRunnerTest: `BIN --job_port N`.
    ['--job_port', '{port}'],
    # Python's PrismRunner (--prism_location).
    [
      '--job_port',
      '{port}',
      '--log_level',
      'info',
      '--log_kind',
      'json',
      '--serve_http=false',
    ],
    # Go-style single-dash flags, as other Beam SDKs pass them to Prism.
    [
      '-job_port={port}',
      '-serve_http=false',
      '-idle_shutdown_timeout=1h',
    ],
    ['serve', '--job_port', '{port}'],
  ],
  ids=['beam-suite', 'prism-runner', 'go-style', 'serve'],
)
def test_job_service_starts(request, refract_bin, tmp_path, flags):
  port = free_port()
  args = [refract_bin] + [f.format(port=port) for f in flags]
  server = RefractServer(refract_bin, tmp_path / 'refract.log', port=port, args=args)
  request.node.refract_processes = [server]  # log shown if the test fails
  try:
    server.wait_ready()
    assert server.proc.poll() is None
  finally:
    server.stop()


def test_sigterm_stops_the_server_cleanly(request, refract_bin, tmp_path, monkeypatch):
  """SIGTERM (`docker stop`, systemd, test harnesses) shuts the server down
  as Ctrl-C does: it exits 0 and removes the spill and staging directories
  it made for itself (before, SIGTERM killed it where it stood and they
  piled up in the temp directory). Those directories are private (0700)
  and their names unpredictable, so another user of the machine can
  neither read them nor create them first."""
  tmp = tmp_path / 'tmp'
  tmp.mkdir()
  monkeypatch.setenv('TMPDIR', str(tmp))
  server = RefractServer(refract_bin, tmp_path / 'refract.log')
  request.node.refract_processes = [server]  # log shown if the test fails
  try:
    server.wait_ready()
    made = sorted(tmp.iterdir())
    kinds = [p.name.rsplit('-', 1)[0] for p in made]
    assert kinds == ['refract-spill', 'refract-staging'], made
    for path in made:
      assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
      assert str(server.port) not in path.name, path
      assert str(server.proc.pid) not in path.name, path
    os.kill(server.proc.pid, signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    assert not list(tmp.iterdir())
  finally:
    server.stop()


def test_a_killed_servers_directories_are_removed_by_the_next(
  request, refract_bin, tmp_path, monkeypatch
):
  """A server killed where it stands (SIGKILL, the OOM killer) cannot
  remove its spill and staging directories; the next server to start in
  the same temp directory does, once their owner is gone. A live server's
  directories and directories Refract did not make are left alone."""
  tmp = tmp_path / 'tmp'
  tmp.mkdir()
  monkeypatch.setenv('TMPDIR', str(tmp))
  unrelated = tmp / 'refract-not-ours'
  unrelated.mkdir()
  first = RefractServer(refract_bin, tmp_path / 'first.log')
  second = None
  request.node.refract_processes = [first]
  try:
    first.wait_ready()
    abandoned = sorted(p for p in tmp.iterdir() if p != unrelated)
    assert len(abandoned) == 2, abandoned
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(timeout=30)
    assert all(p.exists() for p in abandoned)
    second = RefractServer(refract_bin, tmp_path / 'second.log')
    request.node.refract_processes.append(second)
    second.wait_ready()
    deadline = time.monotonic() + 30
    while any(p.exists() for p in abandoned) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not any(p.exists() for p in abandoned), abandoned
    live = sorted(p for p in tmp.iterdir() if p != unrelated)
    assert len(live) == 2 and unrelated.exists(), live
    assert 'ended without cleaning up' in second.log_tail()
  finally:
    first.stop()
    if second:
      second.stop()


def _listening_sockets(pid):
  """(hex local address, port) of every TCP socket process `pid` listens on,
  read from /proc (so no traffic is sent anywhere)."""
  inodes = set()
  fd_dir = '/proc/%d/fd' % pid
  for fd in os.listdir(fd_dir):
    try:
      target = os.readlink(os.path.join(fd_dir, fd))
    except OSError:
      continue
    if target.startswith('socket:['):
      inodes.add(target[len('socket:[') : -1])
  found = []
  for path in ('/proc/net/tcp', '/proc/net/tcp6'):
    try:
      with open(path) as f:
        lines = f.readlines()[1:]
    except OSError:
      continue
    for line in lines:
      fields = line.split()
      local, state, inode = fields[1], fields[3], fields[9]
      if state == '0A' and inode in inodes:  # 0A: LISTEN
        addr, port_hex = local.split(':')
        found.append((addr, int(port_hex, 16)))
  return found


_LOOPBACK = {
  '0100007F',  # 127.0.0.1
  '00000000000000000000000001000000',  # ::1
  '0000000000000000FFFF00000100007F',  # ::ffff:127.0.0.1
}


def test_ports_listen_on_loopback_only(refract_server):
  """The job port and the Fn API port are reachable from this machine only
  (README, Security)."""
  sockets = _listening_sockets(refract_server.proc.pid)
  assert refract_server.port in [port for _, port in sockets], (
    'refract (pid %d) does not itself listen on the job port %d: %s'
    % (refract_server.proc.pid, refract_server.port, sockets)
  )
  exposed = [(a, p) for a, p in sockets if a not in _LOOPBACK]
  assert not exposed, (
    'refract listens beyond loopback on %s (/proc/net/tcp hex addresses)' % exposed
  )
