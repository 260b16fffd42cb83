"""`RefractRunner`: run a Beam Python pipeline on a Refract server that
this process starts.

Like Beam's PrismRunner, the first pipeline a process runs starts the
server (the `refract` binary this package installed) and later pipelines
of the process reuse it; it stops when the process exits. Unlike it, the
pipeline's Python code runs in worker processes (one per core), not in a
thread of the submitting process, where one GIL serialises every bundle:

* the workers are PROCESS workers booted with this interpreter (the boot
  program ships in this package), forked from one process of it that
  imported Beam once (so a worker starts in milliseconds, not a second),
  and see the submitting process's
  `sys.path` — a pipeline's functions from importable modules are pickled
  by reference, so a module found through a path the process added at run
  time (a test's conftest, the script's own directory) must be found there
  too;
* `--sdk_worker_parallelism` defaults to 0, the server's choice of one
  worker per core;
* the SDK does not run `pip freeze` to log the submission environment
  (`disable_logging_submission_environment`), which costs ~0.4 s a job.

An `--environment_type` the pipeline passes wins over all of that (with
`--environment_type=LOOPBACK`, the code runs in this process, as with
PrismRunner).
"""

import atexit
import json
import logging
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading

import apache_beam
from apache_beam.options import pipeline_options
from apache_beam.runners.portability import job_server
from apache_beam.runners.portability import portable_runner
from apache_beam.utils import shared
from apache_beam.utils import subprocess_server

from refract_beam import _binary

_SKIP_PIP_FREEZE = 'disable_logging_submission_environment'


class RefractOptions(pipeline_options.PipelineOptions):
  """Options of `RefractRunner`."""

  @classmethod
  def _add_argparse_args(cls, parser):
    parser.add_argument(
      '--refract_location',
      default=None,
      help='The refract binary to start (default: $REFRACT_BIN, else the '
      'one the refract-beam package installed, else refract on PATH).',
    )


class RefractRunner(portable_runner.PortableRunner):
  """Runs pipelines on a Refract server started for this process."""

  _shared_server = shared.Shared()

  def run_pipeline(self, pipeline, options):
    binary = _binary.find(options.view_as(RefractOptions).refract_location)
    _check_versions(binary)
    debug = options.view_as(pipeline_options.DebugOptions)
    if not debug.lookup_experiment(_SKIP_PIP_FREEZE):
      debug.add_experiment(_SKIP_PIP_FREEZE)
    return super().run_pipeline(pipeline, options)

  def default_environment(self, options):
    portable = options.view_as(pipeline_options.PortableOptions)
    if not portable.environment_type and not portable.output_executable_path:
      portable.environment_type = 'PROCESS'
      portable.environment_config = json.dumps(
        {
          'command': _worker_boot(),
          'env': {'PYTHONPATH': _import_path()},
        }
      )
      if not _given(options, 'sdk_worker_parallelism'):
        portable.sdk_worker_parallelism = 0
    return super().default_environment(options)

  def default_job_server(self, options):
    return RefractRunner._shared_server.acquire(
      lambda: job_server.StopOnExitJobServer(RefractJobServer(options))
    )

  def create_job_service_handle(self, job_service, options):
    return portable_runner.JobServiceHandle(job_service, options, retain_unknown_options=True)


class RefractLogLines(logging.Filter):
  """Turns the server's log lines back into log records.

  Beam logs each line the server prints as an INFO record of
  `RefractJobServer`; the server writes JSON lines (`--log_kind json`,
  in the shape of Go's log/slog), so each becomes a record with the
  server's level and message under the logger name `refract`, or
  `refract.worker@<id>` for a line an SDK worker logged. A runner warning
  then shows as a warning; routine lines stay INFO (hidden at Python's
  default WARNING level)."""

  def filter(self, record):
    if record.funcName != 'log_stdout':
      return True
    try:
      line = json.loads(record.getMessage())
    except ValueError:
      return True
    if not isinstance(line, dict) or 'msg' not in line:
      return True
    level = str(line.get('level', 'INFO'))
    base = level.split('+')[0].split('-')[0]
    record.levelno = getattr(logging, base, logging.INFO)
    record.levelname = logging.getLevelName(record.levelno)
    if line['msg'] == 'log from SDK worker':
      worker = line.get('worker') or {}
      sdk = line.get('sdk') or {}
      record.name = 'refract.worker@%s' % worker.get('ID', '?')
      record.msg = str(sdk.get('msg', ''))
    else:
      record.name = 'refract'
      extras = ', '.join(
        '%s=%r' % (k, v) for k, v in line.items() if k not in ('time', 'level', 'msg')
      )
      record.msg = line['msg'] + (' (%s)' % extras if extras else '')
    record.args = ()
    return True


class RefractJobServer(job_server.SubprocessJobServer):
  """`refract serve` on free ports of this machine's loopback address."""

  def __init__(self, options):
    super().__init__()
    self._log_filter = RefractLogLines()
    self._binary = _binary.find(options.view_as(RefractOptions).refract_location)
    self._job_port = options.view_as(pipeline_options.JobServerOptions).job_port

  def subprocess_cmd_and_endpoint(self):
    job_port, ui_port = subprocess_server.pick_port(self._job_port, None)
    # Printed once: the server serves every later pipeline of the process.
    print(
      f'Refract is running pipelines of this process; its web UI is at http://127.0.0.1:{ui_port}/',
      file=sys.stderr,
      flush=True,
    )
    cmd = [
      self._binary,
      'serve',
      '--job_port',
      str(job_port),
      '--ui_port',
      str(ui_port),
      '--log_kind',
      'json',
    ]
    return cmd, f'127.0.0.1:{job_port}'


_checked = {}
_checked_lock = threading.Lock()
_warned = set()
_LOGGER = logging.getLogger(__name__)


def _check_versions(binary):
  """Refuses an apache-beam older than `binary` supports; warns once per
  process of one newer than it was tested with (the range is asked once
  per binary)."""
  with _checked_lock:
    supported = _checked.get(binary)
    if supported is None:
      supported = _binary.supported_python_range(binary)
      _checked[binary] = supported
  warning = _binary.check_beam_version(apache_beam.__version__, supported, binary)
  with _checked_lock:
    if warning and warning not in _warned:
      _warned.add(warning)
      _LOGGER.warning('%s', warning)


def _given(options, name):
  """Whether the pipeline's own flags or keywords set option `name`."""
  flags = getattr(options, '_flags', None) or []
  if any(f == f'--{name}' or f.startswith(f'--{name}=') for f in flags):
    return True
  return name in options.get_all_options(drop_default=True)


def _import_path():
  """This process's `sys.path`, as a PYTHONPATH for its workers."""
  entries = []
  for entry in sys.path:
    entry = os.path.abspath(entry or os.getcwd())
    if entry not in entries and os.path.exists(entry):
      entries.append(entry)
  return os.pathsep.join(entries)


_boot_lock = threading.Lock()
_boot_program = None
_fork_server = None


def _worker_boot():
  """The PROCESS environment's command: a program, private to this user
  and process, that boots a Python SDK worker with this interpreter,
  forked from a server (started here, for this process's life) that
  imported Beam once, instead of importing it again in every worker."""
  global _boot_program, _fork_server
  with _boot_lock:
    if _boot_program is None:
      here = os.path.dirname(__file__)
      script = os.path.join(here, 'python_boot.sh')
      worker = os.path.join(here, 'python_worker.py')
      for path in (script, worker):
        if not os.path.isfile(path):
          raise RuntimeError(f'the refract-beam package is incomplete: {path} is missing')
      directory = tempfile.mkdtemp(prefix='refract-beam-')  # mode 0700
      atexit.register(shutil.rmtree, directory, True)
      socket_path = os.path.join(directory, 'fork.sock')
      # It ends when its standard input closes: when this process ends.
      with open(os.path.join(directory, 'fork_server.log'), 'wb') as log:
        _fork_server = subprocess.Popen(
          [sys.executable, worker, 'serve', socket_path],
          stdin=subprocess.PIPE,
          stdout=subprocess.DEVNULL,
          stderr=log,
        )
      program = os.path.join(directory, 'boot')
      with open(program, 'w') as f:
        f.write(
          '#!/bin/sh\nREFRACT_FORKSERVER=%s BEAM_PYTHON=%s exec /bin/bash %s '
          '"$@"\n' % (shlex.quote(socket_path), shlex.quote(sys.executable), shlex.quote(script))
        )
      os.chmod(program, stat.S_IRWXU)
      _boot_program = program
    return _boot_program
