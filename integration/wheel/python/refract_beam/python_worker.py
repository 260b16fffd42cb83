"""A Beam Python SDK worker for a PROCESS environment, and the fork server
that makes starting one cheap.

python_boot.sh parses the runner's flags and runs this file with the
pipeline's interpreter, reading it from stdin (`python - ...`), so that the
working directory comes first on `sys.path` as for any `python -` program.
What it does depends on its environment:

* Plain: it asks the runner's provision service for the pipeline options,
  fetches the staged files (the pickled main session of
  `--save_main_session`, for example), sets the variables Beam's harness
  reads and runs the harness (`sdk_worker_main`) in this interpreter,
  leaving out of its options and its log two warnings that are false here
  (see `options_the_harness_reads`, `NoStagedSession`); when the harness
  ends, it removes the worker's directory if python_boot.sh made it.
  Importing Beam takes about a second of CPU, paid by every worker.

* With `REFRACT_FORKSERVER=SOCKET`: it hands its environment, working
  directory and standard streams to the fork server listening at SOCKET
  and exits as the worker the server forks for it exits. The server
  imported Beam once, so a worker starts in milliseconds. Should the
  server not answer, it runs the worker itself, as above.

* `serve SOCKET` (run as a file, not from stdin): the fork server. It
  binds SOCKET, imports Beam, and for each connection forks a child that
  becomes the worker described by what the connection sent. A connection
  that closes (its boot process was killed) has its worker killed; a
  worker that exits has its status sent back. The server ends with its
  parent (`refract run`, or the Python process running `RefractRunner`),
  which holds its standard input open, and each worker with the server.

The fork server runs only code of the user who started it: its socket is in
a directory only that user can enter.
"""

import errno
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import sys
import traceback

# How much a fork request may carry: the environment, as JSON. (A Unix
# socket's send buffer, ~208 KiB unless raised system-wide, bounds it
# first: a bigger request is not sent, and its worker boots on its own.)
MAX_REQUEST = 1 << 20
# A Linux prctl option: a signal for this process when its parent dies.
PR_SET_PDEATHSIG = 1


def die_with_parent(sig):
  """Asks Linux to send `sig` to this process when its parent ends; does
  nothing where that cannot be asked."""
  try:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
  except (OSError, AttributeError):
    pass


class NoStagedSession(logging.Filter):
  """Drops the warning Beam's harness logs when it finds no pickled main
  session, for a job that staged none: the pipeline did not ask for one
  (`--save_main_session`), so nothing is missing. `refract run` shows the
  job's warnings on the console, and every worker would print it there.
  Any other record passes; so does this one if Beam words it otherwise."""

  def filter(self, record):
    return record.msg != 'No session file found: %s.%s'


def options_the_harness_reads(options):
  """`options` (the provisioned pipeline options, by portable name) less
  the options the harness would discard with a warning at every start.

  Beam writes a true boolean option back to flags as `--NAME`; an option
  whose flag is not `--NAME` (`--no_pipeline_type_check` sets
  `pipeline_type_check`, true by default) is then unparseable, and the
  harness logs "Discarding unparseable args" and keeps its default (true),
  the very value it was given. Such options are left out, so the harness
  starts with the same options and without the warning. Should Beam's
  option classes not be readable as expected, nothing is left out.
  """
  try:
    from apache_beam.options import pipeline_options as beam_options

    parser = beam_options._BeamArgumentParser(allow_abbrev=False)
    for cls in beam_options.PipelineOptions.__subclasses__():
      cls._add_argparse_args(parser)
    flags = {flag for action in parser._actions for flag in action.option_strings}
    flagged_otherwise = {
      action.dest
      for action in parser._actions
      if action.default is True and '--' + action.dest not in flags
    }
  except Exception:  # pylint: disable=broad-except
    return options

  def name(key):
    if key.startswith('beam:option:') and key.endswith(':v1'):
      return key[len('beam:option:') : -len(':v1')]
    return key

  return {
    key: value
    for key, value in options.items()
    if not (value is True and name(key) in flagged_otherwise)
  }


def run_harness():
  """Provisions this worker and runs Beam's SDK harness until it ends; then
  removes the worker's directory if python_boot.sh made it (rather than
  being given one), whether the harness ended well or not."""
  semi = os.environ.get('BOOT_SEMI', '')
  owned = os.environ.get('BOOT_SEMI_OWNED') == '1'
  try:
    provision_and_run_harness()
  finally:
    if owned and semi:
      shutil.rmtree(semi, ignore_errors=True)


def provision_and_run_harness():
  """Provisions this worker from the runner's services (the BOOT_* variables
  python_boot.sh set) and runs Beam's SDK harness until it ends."""
  import grpc
  from google.protobuf import json_format
  from google.protobuf import text_format

  from apache_beam.portability import common_urns
  from apache_beam.portability.api import beam_artifact_api_pb2
  from apache_beam.portability.api import beam_artifact_api_pb2_grpc
  from apache_beam.portability.api import beam_provision_api_pb2
  from apache_beam.portability.api import beam_provision_api_pb2_grpc
  from apache_beam.portability.api import beam_runner_api_pb2
  from apache_beam.portability.api import endpoints_pb2
  from apache_beam.runners.internal import names

  env = os.environ
  worker_id = env['BOOT_ID']
  metadata = [('worker_id', worker_id)] if worker_id else []
  out = {'WORKER_ID': worker_id, 'SEMI_PERSISTENT_DIRECTORY': env['BOOT_SEMI']}

  def descriptor(url):
    return text_format.MessageToString(
      endpoints_pb2.ApiServiceDescriptor(url=url), as_one_line=True
    )

  out['CONTROL_API_SERVICE_DESCRIPTOR'] = descriptor(env['BOOT_CONTROL'])
  if env['BOOT_LOGGING']:
    out['LOGGING_API_SERVICE_DESCRIPTOR'] = descriptor(env['BOOT_LOGGING'])

  options = {}
  session_staged = False
  if env['BOOT_PROVISION']:
    channel = grpc.insecure_channel(env['BOOT_PROVISION'])
    try:
      info = (
        beam_provision_api_pb2_grpc.ProvisionServiceStub(channel)
        .GetProvisionInfo(
          beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=metadata, timeout=60
        )
        .info
      )
    except grpc.RpcError as e:
      sys.exit('python_boot.sh: GetProvisionInfo at %s failed: %s' % (env['BOOT_PROVISION'], e))
    options = json_format.MessageToDict(info.pipeline_options)
    out['RUNNER_CAPABILITIES'] = ' '.join(info.runner_capabilities)
    if info.status_endpoint.url:
      out['STATUS_API_SERVICE_DESCRIPTOR'] = descriptor(info.status_endpoint.url)
    for key in ('job_name', 'job_id'):
      if key in info.metadata:
        out[key.upper()] = info.metadata[key]

    # Staged files (e.g. the pickled main session) go to
    # <semi>/staged/<name>, where the harness looks for them.
    staging_to = common_urns.artifact_roles.STAGING_TO.urn
    artifacts = [d for d in info.dependencies if d.role_urn == staging_to]
    session_staged = any(
      os.path.basename(
        beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(a.role_payload).staged_name
      )
      == names.PICKLED_MAIN_SESSION_FILE
      for a in artifacts
    )
    if artifacts and env['BOOT_ARTIFACT']:
      stub = beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub(
        grpc.insecure_channel(env['BOOT_ARTIFACT'])
      )
      for artifact in artifacts:
        name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(
          artifact.role_payload
        ).staged_name
        path = os.path.join(env['BOOT_SEMI'], 'staged', os.path.basename(name))
        try:
          with open(path, 'wb') as f:
            for chunk in stub.GetArtifact(
              beam_artifact_api_pb2.GetArtifactRequest(artifact=artifact),
              metadata=metadata,
              timeout=300,
            ):
              f.write(chunk.data)
        except grpc.RpcError as e:
          sys.exit('python_boot.sh: fetching %s failed: %s' % (name, e))
  out['PIPELINE_OPTIONS'] = json.dumps(options_the_harness_reads(options))

  for key in [k for k in os.environ if k.startswith('BOOT_')]:
    del os.environ[key]
  os.environ.update(out)
  # Beam's interceptor that names the worker on its log channel reads
  # WORKER_ID once, when it is imported: in a worker forked from the fork
  # server, that was before there was a worker, and the runner would refuse
  # the channel (and with it every log line) for want of an id.
  from apache_beam.runners.worker import worker_id_interceptor

  worker_id_interceptor.WorkerIdInterceptor._worker_id = worker_id
  from apache_beam.runners.worker import sdk_worker_main

  if not session_staged:
    logging.getLogger(sdk_worker_main.__name__).addFilter(NoStagedSession())
  sdk_worker_main.main([sys.argv[0]])


# --- the boot side: asking the fork server for a worker ---------------------


def exit_code(status):
  """A wait status as a shell reports it: the exit code, or 128 + signal."""
  if os.WIFSIGNALED(status):
    return 128 + os.WTERMSIG(status)
  return os.WEXITSTATUS(status)


def forked_by(path):
  """Has the fork server at `path` start this worker; returns its exit
  code once it ends, or None (nothing started) if the server cannot be
  reached."""
  request = json.dumps(
    {
      'env': dict(os.environ),
      'cwd': os.getcwd(),
      'argv': sys.argv,
      'pgid': os.getpgrp(),
    }
  ).encode()
  conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  try:
    conn.connect(path)
    socket.send_fds(conn, [request], [0, 1, 2])
    started = conn.recv(64)
  except OSError as e:
    if e.errno == errno.EMSGSIZE:
      why = (
        'its request, %d bytes of environment, directory and '
        'arguments, is more than its socket takes' % len(request)
      )
    else:
      why = 'did not answer (%s)' % e
    print(
      'python_boot.sh: the fork server at %s %s; starting the worker here' % (path, why),
      file=sys.stderr,
    )
    conn.close()
    return None
  if not started.startswith(b'pid '):
    print(
      'python_boot.sh: the fork server at %s refused: %r; starting the '
      'worker here' % (path, started[:200]),
      file=sys.stderr,
    )
    conn.close()
    return None
  # From here the worker runs; this process stands for it. A signal that
  # ends this process closes the connection, and the server kills the
  # worker.
  ended = conn.recv(64)
  if ended.startswith(b'exit '):
    return int(ended[5:])
  print(
    'python_boot.sh: the fork server ended before worker %s did'
    % started[4:].decode(errors='replace'),
    file=sys.stderr,
  )
  return 1


# --- the fork server ---------------------------------------------------------


def become_worker(request, fds, closing, server_pid):
  """In a freshly forked child of the server `server_pid`: takes on the
  boot process's standard streams, environment, working directory and
  process group, and runs the harness; never returns."""
  code = 1
  try:
    for fd in closing:
      os.close(fd)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM):
      signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    die_with_parent(signal.SIGKILL)
    if os.getppid() != server_pid:
      return  # The server ended before the signal was asked for.
    # Into the boot process's process group, where the runner put it: a
    # terminal's Ctrl-C to the server's group must not reach the worker,
    # and the runner's signal to the boot process's group must.
    pgid = request.get('pgid')
    if isinstance(pgid, int):
      try:
        os.setpgid(0, pgid)
      except (OSError, OverflowError):
        pass  # No such group here: the worker stays in the server's.
    for target, fd in enumerate(fds):
      os.dup2(fd, target)
      os.close(fd)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, 'w', closefd=False, buffering=1)
    sys.stderr = open(2, 'w', closefd=False, buffering=1)
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    os.environ.pop('REFRACT_FORKSERVER', None)
    # What `python -` would have put on sys.path from this environment.
    extra = [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]
    sys.path[1:1] = [p for p in extra if p not in sys.path]
    sys.argv = list(request['argv'])
    run_harness()
    code = 0
  except SystemExit as e:
    if isinstance(e.code, int):
      code = e.code
    elif e.code is not None:
      print(e.code, file=sys.stderr)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)


def serve(path):
  """The fork server's loop (see the module doc); returns when its
  standard input, a pipe its parent holds open, closes: the parent ended
  (all its threads, unlike a parent-death signal, which follows the thread
  that started this process)."""
  # Run as `python python_worker.py serve ...`; its workers see the working
  # directory first on sys.path, as when python_boot.sh runs them.
  sys.path[0] = ''
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  listener.bind(path)
  listener.listen(64)
  # Bound before Beam is imported: a worker asking early waits in the
  # backlog instead of starting on its own. Imported only to have them
  # loaded in this process, for the workers it forks.
  import apache_beam  # noqa: F401  # pylint: disable=unused-import
  from apache_beam.runners.worker import sdk_worker_main  # noqa: F401  # pylint: disable=unused-import
  import grpc  # noqa: F401  # pylint: disable=unused-import
  from google.protobuf import json_format  # noqa: F401  # pylint: disable=unused-import

  wake_r, wake_w = os.pipe()
  os.set_blocking(wake_w, False)
  signal.set_wakeup_fd(wake_w)
  signal.signal(signal.SIGCHLD, lambda *_: None)
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
  # A terminal's Ctrl-C reaches the group it was started in; what it
  # interrupts stops its workers through their runner, and this server
  # ends with its standard input.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  selector = selectors.DefaultSelector()
  selector.register(listener, selectors.EVENT_READ, 'listener')
  selector.register(wake_r, selectors.EVENT_READ, 'signal')
  selector.register(0, selectors.EVENT_READ, 'parent')
  workers = {}  # pid -> connection of the boot process standing for it
  try:
    while True:
      for key, _ in selector.select():
        if key.data == 'listener':
          conn, _ = listener.accept()
          fork_worker(conn, selector, workers, [listener.fileno(), wake_r, wake_w])
        elif key.data == 'parent':
          if not os.read(0, 512):
            return
        elif key.data == 'signal':
          os.read(wake_r, 512)
          reap(selector, workers)
        elif workers.get(key.data) is key.fileobj:
          # A boot process's connection: it only ever closes, when that
          # process ended; its worker goes with it.
          conn = key.fileobj
          try:
            closed = not conn.recv(64)
          except OSError:
            closed = True
          if closed:
            workers.pop(key.data)
            selector.unregister(conn)
            conn.close()
            try:
              os.kill(key.data, signal.SIGKILL)
            except ProcessLookupError:
              pass
  finally:
    for pid in list(workers):
      try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
      except (ProcessLookupError, ChildProcessError):
        pass


def refuse(conn, fds, why):
  """Answers a boot process that gets no worker, and lets go of it and of
  the descriptors it sent."""
  for fd in fds:
    os.close(fd)
  try:
    conn.send(b'refused: %s' % why.encode()[:200])
  except OSError:
    pass
  conn.close()


def fork_worker(conn, selector, workers, server_fds):
  """Reads a boot process's request from `conn` and forks its worker."""
  fds = []
  try:
    message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
    request = json.loads(message)
    if (
      len(fds) != 3
      or not isinstance(request, dict)
      or not isinstance(request.get('env'), dict)
      or not isinstance(request.get('cwd'), str)
      or not isinstance(request.get('argv'), list)
    ):
      raise ValueError('expected env, cwd and argv, and three descriptors')
  except (OSError, ValueError) as e:
    refuse(conn, fds, str(e))
    return
  others = [c.fileno() for c in workers.values()]
  server_pid = os.getpid()
  try:
    pid = os.fork()
  except OSError as e:
    refuse(conn, fds, 'fork failed: %s' % e)
    return
  if pid == 0:
    become_worker(request, fds, server_fds + others + [conn.fileno()], server_pid)
  for fd in fds:
    os.close(fd)
  workers[pid] = conn
  selector.register(conn, selectors.EVENT_READ, pid)
  try:
    conn.send(b'pid %d' % pid)
  except OSError:
    pass


def reap(selector, workers):
  """Reports every worker that ended to its boot process."""
  while True:
    try:
      pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return
    conn = workers.pop(pid, None)
    if conn is None:
      continue
    try:
      selector.unregister(conn)
    except (KeyError, ValueError):
      pass
    try:
      conn.send(b'exit %d' % exit_code(status))
    except OSError:
      pass
    conn.close()


def main(argv):
  if len(argv) == 3 and argv[1] == 'serve':
    serve(argv[2])
    return
  server = os.environ.pop('REFRACT_FORKSERVER', '')
  if server:
    code = forked_by(server)
    if code is not None:
      sys.exit(code)
  run_harness()


if __name__ == '__main__':
  main(sys.argv)
