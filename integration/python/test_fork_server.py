"""The fork server of Python workers (python_worker.py of the refract_beam
package, integration/wheel/python/refract_beam), driven as python_boot.sh
drives it, without a runner: a boot process stands for the worker forked
for it — its exit status, its output, its death — and the server and its
workers end when the server's parent lets go of it.

The workers here are given a control endpoint where nothing listens, so
Beam's harness waits there until killed; or no endpoint at all, so it
fails at once. `refract run` and `RefractRunner` jobs through the server
are in test_cli_run.py and test_wheel.py."""

import json
import os
import signal
from concurrent import futures
import socket
import subprocess
import sys
import time

import grpc
import pytest
from apache_beam.portability.api import beam_fn_api_pb2_grpc

from refract_testlib import alive
from refract_testlib import children_by_parent
from refract_testlib import free_port
from refract_testlib import stat_fields

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(REPO, 'integration', 'wheel', 'python', 'refract_beam')
WORKER = os.path.join(PACKAGE, 'python_worker.py')
BOOT = os.path.join(PACKAGE, 'python_boot.sh')


def children_of(pid):
  """The pids whose parent is `pid` (from /proc)."""
  return children_by_parent().get(pid, [])


def wait_until(what, condition, timeout_s=30):
  deadline = time.monotonic() + timeout_s
  while not condition():
    if time.monotonic() > deadline:
      pytest.fail('timed out waiting until %s' % what, pytrace=False)
    time.sleep(0.05)


@pytest.fixture
def fork_server(tmp_path):
  """A fork server on a socket in `tmp_path`; its stdin is the pipe that
  keeps it alive."""
  sock = str(tmp_path / 'fork.sock')
  server = subprocess.Popen(
    [sys.executable, WORKER, 'serve', sock],
    stdin=subprocess.PIPE,
    stdout=subprocess.DEVNULL,
    stderr=open(tmp_path / 'server.log', 'wb'),
  )
  wait_until('the server listens', lambda: os.path.exists(sock))
  yield server, sock
  server.kill()
  server.wait()


def boot(sock, tmp_path, control, extra_env=None, own_group=False):
  """A boot process as python_boot.sh starts it, asking `sock`'s server;
  with `own_group`, in a process group of its own, as the runner starts
  it."""
  env = dict(
    os.environ,
    **(extra_env or {}),
    REFRACT_FORKSERVER=sock,
    BOOT_ID='w1',
    BOOT_CONTROL=control,
    BOOT_LOGGING='',
    BOOT_PROVISION='',
    BOOT_ARTIFACT='',
    BOOT_SEMI=str(tmp_path),
  )
  if control is None:
    del env['BOOT_CONTROL']
  with open(WORKER) as script:
    return subprocess.Popen(
      [sys.executable, '-', 'sdk_worker_main', '--id=w1'],
      stdin=script,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=env,
      process_group=0 if own_group else None,
    )


def forked_worker(server):
  wait_until('a worker is forked', lambda: children_of(server.pid))
  return children_of(server.pid)[0]


def test_a_worker_that_fails_fails_its_boot_process_with_its_error(fork_server, tmp_path):
  server, sock = fork_server
  proc = boot(sock, tmp_path, control=None)
  _, err = proc.communicate(timeout=60)
  # The worker's traceback went to the boot process's stderr, and its
  # exit status is the boot process's.
  assert proc.returncode == 1, err.decode()[-2000:]
  assert "KeyError: 'BOOT_CONTROL'" in err.decode(), err.decode()[-2000:]
  assert 'starting the worker here' not in err.decode()
  wait_until('the worker is reaped', lambda: not children_of(server.pid))


def test_a_killed_boot_process_takes_its_worker_with_it(fork_server, tmp_path):
  server, sock = fork_server
  proc = boot(sock, tmp_path, control='localhost:%d' % free_port())
  worker = forked_worker(server)
  assert alive(worker)
  proc.send_signal(signal.SIGKILL)
  proc.wait(timeout=10)
  wait_until('the worker is gone', lambda: not alive(worker), 10)
  # The server goes on serving.
  again = boot(sock, tmp_path, control=None)
  again.communicate(timeout=60)
  assert again.returncode == 1


def test_the_server_and_its_workers_end_when_its_parent_lets_go(fork_server, tmp_path):
  server, sock = fork_server
  proc = boot(sock, tmp_path, control='localhost:%d' % free_port())
  worker = forked_worker(server)
  server.stdin.close()
  server.wait(timeout=10)
  wait_until('the worker is gone', lambda: not alive(worker), 10)
  # The boot process learns that its worker is gone, and fails.
  _, err = proc.communicate(timeout=10)
  assert proc.returncode != 0
  assert b'fork server ended before worker' in err, err[-2000:]


def test_without_a_server_the_boot_process_runs_the_worker_itself(tmp_path):
  proc = boot(str(tmp_path / 'nobody.sock'), tmp_path, control=None)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 1
  assert b'did not answer' in err and b'starting the worker here' in err, err
  assert b"KeyError: 'BOOT_CONTROL'" in err, err[-2000:]


def test_a_request_that_is_not_a_worker_is_refused(fork_server):
  server, sock = fork_server
  conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  conn.connect(sock)
  conn.send(b'not json')
  assert conn.recv(200).startswith(b'refused: ')
  conn.close()
  assert server.poll() is None
  assert not children_of(server.pid)


def test_an_environment_too_big_to_send_boots_its_worker_itself(fork_server, tmp_path):
  """A request is one message on the server's socket, which takes ~208 KiB
  unless the system's limit is raised: a bigger environment (each variable
  may hold 128 KiB) gets its worker booted by the boot process itself,
  saying why."""
  server, sock = fork_server
  big = {'REFRACT_TEST_BIG_%d' % i: 'x' * 100000 for i in range(4)}
  proc = boot(sock, tmp_path, control=None, extra_env=big)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 1
  assert b'is more than its socket takes; starting the worker here' in err, err[-2000:]
  assert b"KeyError: 'BOOT_CONTROL'" in err, err[-2000:]
  assert server.poll() is None
  assert not children_of(server.pid)


def test_a_worker_joins_its_boot_process_group_and_ctrl_c_spares_it(fork_server, tmp_path):
  """The runner starts each boot process in a process group of its own and
  signals that group to stop it: the forked worker joins it. A terminal's
  Ctrl-C, sent to the group the server runs in, stops neither the server
  nor the worker (the runner stops those)."""
  server, sock = fork_server
  proc = boot(sock, tmp_path, control='localhost:%d' % free_port(), own_group=True)
  worker = forked_worker(server)
  wait_until('the worker joins the group', lambda: int(stat_fields(worker)[2]) == proc.pid)
  server.send_signal(signal.SIGINT)
  time.sleep(1)
  assert server.poll() is None
  assert alive(worker)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait(timeout=10)
  wait_until('the worker is gone', lambda: not alive(worker), 10)


def test_a_process_group_out_of_range_is_ignored(fork_server, tmp_path):
  """A request written by hand, whose process group no process can have:
  the worker still starts (and fails only for want of a control
  endpoint, as asked)."""
  server, sock = fork_server
  env = dict(
    os.environ,
    BOOT_ID='w1',
    BOOT_LOGGING='',
    BOOT_PROVISION='',
    BOOT_ARTIFACT='',
    BOOT_SEMI=str(tmp_path),
  )
  request = json.dumps(
    {'env': env, 'cwd': str(tmp_path), 'argv': ['-', 'sdk_worker_main'], 'pgid': 2**70}
  )
  err_r, err_w = os.pipe()
  conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  conn.connect(sock)
  with open(os.devnull, 'rb') as stdin, open(os.devnull, 'wb') as stdout:
    socket.send_fds(conn, [request.encode()], [stdin.fileno(), stdout.fileno(), err_w])
  os.close(err_w)
  assert conn.recv(64).startswith(b'pid ')
  assert conn.recv(64) == b'exit 1'
  conn.close()
  with os.fdopen(err_r, 'rb') as f:
    err = f.read()
  assert b"KeyError: 'BOOT_CONTROL'" in err, err[-2000:]
  assert server.poll() is None


class EndAtOnce(beam_fn_api_pb2_grpc.BeamFnControlServicer):
  """A runner with no work: each worker's control stream ends as it opens,
  so its harness ends as at the end of a job."""

  def Control(self, request_iterator, context):
    return iter(())


@pytest.fixture
def control_with_no_work():
  server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
  beam_fn_api_pb2_grpc.add_BeamFnControlServicer_to_server(EndAtOnce(), server)
  port = server.add_insecure_port('127.0.0.1:0')
  server.start()
  yield '127.0.0.1:%d' % port
  server.stop(None)


def test_a_directory_the_boot_script_made_goes_when_the_harness_ends(
  control_with_no_work, tmp_path
):
  """Started as Beam's worker_pool_main starts a container executable, with
  no directory of its own, python_boot.sh makes one (in TMPDIR); it is gone
  once the harness has ended (it was left behind, one per worker). One left
  by a worker killed before its harness ended (worker_pool_main kills a
  worker a second after StopWorker) goes when the next worker starts; one
  whose worker lives stays."""
  tmp = tmp_path / 'tmp'
  tmp.mkdir()
  gone = subprocess.Popen(['true'])
  gone.wait()
  killed = tmp / ('refract-worker-w0.pid%d.AbC123' % gone.pid)
  living = tmp / ('refract-worker-w9.pid%d.XyZ789' % os.getpid())
  for d in (killed, living):
    (d / 'staged').mkdir(parents=True)
  env = dict(os.environ, TMPDIR=str(tmp), BEAM_PYTHON=sys.executable)
  env.pop('SEMI_PERSISTENT_DIRECTORY', None)
  done = subprocess.run(
    [BOOT, '--id=w1', '--control_endpoint=' + control_with_no_work],
    capture_output=True,
    env=env,
    timeout=120,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert b'No more requests from control plane' in done.stderr, done.stderr[-3000:]
  assert os.listdir(tmp) == [living.name], os.listdir(tmp)


def test_a_forked_worker_removes_the_directory_its_boot_script_made(
  fork_server, control_with_no_work, tmp_path
):
  _, sock = fork_server
  semi = tmp_path / 'made-by-boot'
  (semi / 'staged').mkdir(parents=True)
  proc = boot(sock, semi, control_with_no_work, extra_env={'BOOT_SEMI_OWNED': '1'})
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  assert not semi.exists()
  # A directory it was given stays.
  given = tmp_path / 'given'
  (given / 'staged').mkdir(parents=True)
  proc = boot(sock, given, control_with_no_work)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  assert given.exists()
