"""Helpers for Refract's end-to-end tests: free ports, starting and stopping
refract processes, and waiting until a job service answers."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
from apache_beam.coders import VarIntCoder

from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.portability.api import beam_job_api_pb2_grpc

READY_TIMEOUT_S = 60


def built_binary(env_var, build_script):
  """A tool binary a test needs: the path in `env_var` if set, else the one
  `build_script` prints last (it builds once, then answers from a cache)."""
  path = os.environ.get(env_var)
  if path:
    return path
  built = subprocess.run([build_script], capture_output=True, text=True, check=True)
  return built.stdout.strip().splitlines()[-1]


def free_port():
  """A TCP port that is free on 127.0.0.1 right now (for the tests, the
  benchmarks and integration/beam_test_modules.py alike)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def accepts(port, host='127.0.0.1'):
  """Whether something accepts TCP connections on `host`:`port` now."""
  try:
    socket.create_connection((host, port), timeout=1).close()
    return True
  except OSError:
    return False


def wait_for_port(port, proc, what, timeout_s=120):
  """Waits until something accepts TCP connections on 127.0.0.1:`port`,
  where process `proc` (`what`, in the error) is to listen; raises
  RuntimeError when it exits first or `timeout_s` seconds pass."""
  deadline = time.monotonic() + timeout_s
  while not accepts(port):
    if proc.poll() is not None:
      raise RuntimeError('%s exited (%s) before listening on %d' % (what, proc.returncode, port))
    if time.monotonic() > deadline:
      raise RuntimeError('%s did not listen on %d within %ds' % (what, port, timeout_s))
    time.sleep(0.1)


def python_job_server_argv(port):
  """The command of Beam's Python job server (local_job_service_main) on
  `port`, in this interpreter: a peer runner of the suites and benchmarks."""
  return [
    sys.executable,
    '-m',
    'apache_beam.runners.portability.local_job_service_main',
    '--port',
    str(port),
  ]


def committed_counter(endpoint, job_id, name, step=None):
  """The committed total of a job's user counter `name` (summed over the
  transforms reporting it, or only transform `step`'s), read with
  GetJobMetrics."""
  with grpc.insecure_channel(endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    metrics = stub.GetJobMetrics(
      beam_job_api_pb2.GetJobMetricsRequest(job_id=job_id), timeout=10
    ).metrics
  return sum(
    VarIntCoder().decode(info.payload)
    for info in metrics.committed
    if info.labels.get('NAME') == name and step in (None, info.labels.get('PTRANSFORM'))
  )


def rss_bytes(pid):
  """Resident set size of process `pid` (0 once it is gone), for the
  memory benchmarks."""
  try:
    with open('/proc/%d/status' % pid) as f:
      for line in f:
        if line.startswith('VmRSS:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def stat_fields(pid):
  """The fields of /proc/PID/stat after the command's name (state, ppid,
  ...), or None once the process is gone. The name may hold spaces and
  parentheses: it ends at the last ')'."""
  try:
    with open('/proc/%s/stat' % pid) as f:
      return f.read().rsplit(')', 1)[1].split()
  except (OSError, IndexError):
    return None


def alive(pid):
  """Whether process `pid` runs (is neither gone nor a zombie waiting for
  its parent)."""
  fields = stat_fields(pid)
  return bool(fields) and fields[0] != 'Z'


def children_by_parent():
  """The pid of every process on the machine, listed under its parent's
  (from /proc)."""
  children = {}
  for entry in os.listdir('/proc'):
    fields = stat_fields(entry) if entry.isdigit() else None
    if fields and len(fields) > 1 and fields[1].isdigit():
      children.setdefault(int(fields[1]), []).append(int(entry))
  return children


def run_sampling_rss(pid, argv, every_s=0.5):
  """Runs `argv` to its end while sampling process `pid`'s resident set
  size every `every_s` seconds, for the memory benchmarks: the finished
  run (output captured), its wall time in seconds, and the samples."""
  samples = []
  done = threading.Event()

  def sample():
    while not done.is_set():
      samples.append(rss_bytes(pid))
      time.sleep(every_s)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  start = time.monotonic()
  try:
    run = subprocess.run(argv, capture_output=True, text=True, check=False)
  finally:
    done.set()
    sampler.join()
  return run, time.monotonic() - start, samples


def final_state(run):
  """The final state a pipeline script run by `run_sampling_rss` printed
  last, for the memory benchmarks' reports; when it is not DONE, with the
  tail of the script's stderr (why the client gave up)."""
  lines = run.stdout.strip().splitlines()
  state = lines[-1] if lines else 'no output'
  if state != 'DONE':
    state += ' (client stderr: %s)' % run.stderr[-2000:]
  return state


def run_pipeline_to_end(pipeline):
  """Runs `pipeline`, printing its job id and then its final state, for
  the pipeline scripts the tests and benchmarks start: the exit code, 0 if
  it is DONE."""
  result = pipeline.run()
  print(result._job_id, flush=True)  # pylint: disable=protected-access
  state = result.wait_until_finish()
  print(state, flush=True)
  return 0 if state == 'DONE' else 1


def stop_process_group(proc, grace_s=10):
  """Sends SIGTERM to the process's group, then SIGKILL if needed."""
  if proc.poll() is None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
      try:
        os.killpg(proc.pid, sig)
      except ProcessLookupError:
        break
      try:
        proc.wait(timeout=wait_s)
        break
      except subprocess.TimeoutExpired:
        continue
  # Leftover children of an exited leader share its group id.
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def wait_until_serving(proc, endpoint, timeout_s=READY_TIMEOUT_S):
  """Polls GetState until the job service answers with anything but
  UNAVAILABLE (the readiness probe Beam's own test harness uses)."""
  deadline = time.monotonic() + timeout_s
  with grpc.insecure_channel(endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    while True:
      if proc.poll() is not None:
        raise RuntimeError(
          'refract exited with code %s before serving on %s' % (proc.returncode, endpoint)
        )
      try:
        stub.GetState(beam_job_api_pb2.GetJobStateRequest(job_id='[fake]'), timeout=2)
        return
      except grpc.RpcError as e:
        if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
          return
      if time.monotonic() > deadline:
        raise RuntimeError('refract did not serve on %s within %ss' % (endpoint, timeout_s))
      time.sleep(0.1)


def read_log_tail(path, max_chars=6000):
  """The last `max_chars` characters of the log file at `path` ('' if it
  cannot be read), marked with '...' when cut."""
  try:
    with open(path, 'rb') as f:
      text = f.read().decode('utf-8', 'replace')
  except OSError:
    return ''
  return text if len(text) <= max_chars else '...' + text[-max_chars:]


def exit_now(code):
  """Ends a pipeline client process with `code` once its output is
  flushed, without waiting for other threads: once a job's end is printed,
  gRPC's threads must not keep the client from exiting (seen: DONE printed,
  then a hang until the test's limit)."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


class RefractProcess:
  """A refract process started by a test, with its log in a file."""

  def __init__(self, args, log_path, cwd=None, env=None):
    self.args = [str(a) for a in args]
    self.log_path = str(log_path)
    self._log = open(self.log_path, 'wb')
    self.proc = subprocess.Popen(
      self.args,
      cwd=cwd,
      env=env,
      stdin=subprocess.DEVNULL,
      stdout=self._log,
      stderr=subprocess.STDOUT,
      start_new_session=True,
    )

  def log_tail(self, max_chars=6000):
    return read_log_tail(self.log_path, max_chars)

  def stop(self):
    stop_process_group(self.proc)
    self._log.close()


@contextlib.contextmanager
def serving(request, server):
  """Waits until `server` (a RefractServer just started) serves, attaches
  its log to the report of a failing test, and stops it afterwards."""
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    yield server
  finally:
    server.stop()


class RefractServer(RefractProcess):
  def __init__(self, binary, log_path, port=None, extra_args=None, args=None, cwd=None, env=None):
    self.port = port or free_port()
    self.endpoint = 'localhost:%d' % self.port
    if args is None:
      args = [binary, 'serve', '--job_port', self.port] + list(extra_args or [])
    super().__init__(args, log_path, cwd=cwd, env=env)

  def wait_ready(self):
    wait_until_serving(self.proc, self.endpoint)
    return self

  def portable_args(self, *extra):
    return [
      '--runner=PortableRunner',
      '--job_endpoint=%s' % self.endpoint,
      '--environment_type=LOOPBACK',
    ] + list(extra)


def budget_server(refract_bin, log_path, budget, extra_args=()):
  """A ready `refract serve --memory_budget BUDGET` whose one job gets the
  whole budget, without the web UI (and with `extra_args`): the server of
  the memory benchmarks. The caller stops it."""
  return RefractServer(
    os.path.abspath(refract_bin),
    log_path,
    extra_args=['--memory_budget', budget, '--job_memory_budget', budget, '--serve_http=false']
    + list(extra_args),
  ).wait_ready()


def ui_server(refract_bin, log_path, extra_args=()):
  """A `refract serve` with its web UI on a free port (and `extra_args`):
  (server, UI base URL). The caller waits for it to be ready and stops it."""
  ui_port = free_port()
  server = RefractServer(
    refract_bin, log_path, extra_args=['--ui_port', str(ui_port)] + list(extra_args)
  )
  return server, 'http://127.0.0.1:%d' % ui_port


def refract_cli(binary, server, *args, check=True):
  """Runs `refract ARGS --job_endpoint` against `server`: the finished
  process (its exit code checked unless `check` is false)."""
  done = subprocess.run(
    [binary, *args, '--job_endpoint', server.endpoint], capture_output=True, text=True, timeout=60
  )
  if check:
    assert done.returncode == 0, done.stderr + done.stdout
  return done


def submit_java(java_classpath, main, endpoint, pool, log, *args):
  """Runs Java pipeline `main` (integration/java) with PortableRunner to
  its submission, its workers from the EXTERNAL worker pool at `pool`,
  its output in file `log`: (exit code, what it printed)."""
  with open(log, 'wb') as out:
    done = subprocess.run(
      [
        'java',
        '-cp',
        java_classpath,
        main,
        '--runner=PortableRunner',
        '--jobEndpoint=' + endpoint,
        '--defaultEnvironmentType=EXTERNAL',
        '--defaultEnvironmentConfig=' + pool,
        *args,
      ],
      stdin=subprocess.DEVNULL,
      stdout=out,
      stderr=subprocess.STDOUT,
      timeout=180,
      check=False,
    )
  with open(log, encoding='utf-8', errors='replace') as f:
    return done.returncode, f.read()


def job_state(endpoint, job_id):
  with grpc.insecure_channel(endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    state = stub.GetState(beam_job_api_pb2.GetJobStateRequest(job_id=job_id), timeout=10).state
  return beam_job_api_pb2.JobState.Enum.Name(state)


def get_json(url):
  """The JSON a GET of `url` answers (the web UI's API)."""
  with urllib.request.urlopen(url, timeout=10) as response:
    return json.loads(response.read().decode())


def job_messages(endpoint, job_id, seconds=1.0):
  """The texts of a job's messages so far: its message stream, read for
  `seconds` at most (it ends at once for a job that has ended)."""
  found = []
  with grpc.insecure_channel(endpoint) as channel:
    stream = beam_job_api_pb2_grpc.JobServiceStub(channel).GetMessageStream(
      beam_job_api_pb2.JobMessagesRequest(job_id=job_id), timeout=seconds
    )
    try:
      for item in stream:
        if item.HasField('message_response'):
          found.append(item.message_response.message_text)
    except grpc.RpcError:
      pass
  return found


def wait_for_end(server, job_id, timeout_s=180):
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    state = job_state(server.endpoint, job_id)
    if state in ('DONE', 'FAILED', 'CANCELLED', 'UPDATED', 'DRAINED'):
      return state
    time.sleep(0.3)
  raise AssertionError(
    'job %s did not end within %ss; log:\n%s' % (job_id, timeout_s, server.log_tail())
  )


def durable_server(refract_bin, state_dir, port, log, interval='200ms', extra=()):
  return RefractServer(
    refract_bin,
    log,
    port=port,
    extra_args=['--state_dir', state_dir, '--checkpoint_interval', interval, '--serve_http=false']
    + list(extra),
  ).wait_ready()


def spilled_bytes(line, what):
  """The byte count `what` (`spilled_bytes`, `queue_spilled_bytes`, ...)
  of a runner's "engine finished" log line."""
  found = re.search(r'\b%s=(\d+)' % what, line)
  assert found, line
  return int(found.group(1))


def finished_line(request, refract_bin, tmp_path, extra, pipeline, args):
  """Runs `pipeline` (a script beside this file) with `args` after the endpoint on a
  server started with `extra`, checks that it is DONE, and returns the
  runner's "engine finished" log line (what it spilled)."""
  server = RefractServer(refract_bin, tmp_path / 'refract-serve.log', extra_args=extra)
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    run = subprocess.run(
      [
        sys.executable,
        os.path.join(os.path.dirname(os.path.abspath(__file__)), pipeline),
        server.endpoint,
      ]
      + [str(a) for a in args],
      capture_output=True,
      text=True,
      timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == 'DONE', run.stdout
    log = server.log_tail(1 << 20)
  finally:
    server.stop()
  finished = [line for line in log.splitlines() if 'engine finished' in line]
  assert finished, log[-3000:]
  return finished[-1]
