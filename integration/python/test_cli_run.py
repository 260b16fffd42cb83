"""`refract run PIPELINE.py`: runs the bundled word count with no server
started beforehand, shows per-stage progress and the job's metrics, and
writes the same counts as Beam's DirectRunner; its workers are forked
processes that load the main session, import beside the script and log to
the pipeline's console without Beam's start-up warnings; Ctrl-C and SIGTERM
stop the run and cancel its job, and a SIGKILL takes the pipeline's process
with it."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

import wordcount  # integration/wordcount, put on sys.path by conftest.py
from refract_testlib import alive
from refract_testlib import children_by_parent


def test_refract_run_wordcount(refract_bin, tmp_path):
  prefix = str(tmp_path / 'refract' / 'counts')
  env = dict(os.environ, REFRACT_PYTHON=sys.executable)
  done = subprocess.run(
    [refract_bin, 'run', wordcount.__file__, '--output', prefix, '--top', '3'],
    capture_output=True,
    text=True,
    timeout=180,
    env=env,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  # It says which server it used: its own, with a web UI for the run.
  assert re.search(
    r'started a Refract \S+ server for this run at 127\.0\.0\.1:\d+; its web '
    r'UI, until the run ends: http://127\.0\.0\.1:\d+/',
    done.stderr,
  ), done.stderr[-3000:]
  out = done.stdout.splitlines()
  # The pipeline's own output, then the job's state and metrics.
  assert 'Total: 3422 words, 726 distinct. Output files: %s*' % prefix in out, out
  job_lines = [line for line in out if line.startswith('job') and line.endswith(': DONE')]
  assert len(job_lines) == 1, out
  assert any(line.startswith('  elements in ') for line in out), out
  # One progress line per stage, each finished.
  progress = [line for line in done.stderr.splitlines() if line.startswith('  #')]
  assert progress and all(line.endswith('watermark +inf') for line in progress), done.stderr[-3000:]
  assert any('Count' in line for line in progress), progress
  # The workers' start is quiet: Beam's harness would warn of a main session
  # the job never staged and of options it "discards" while keeping their
  # values, once per worker, on this console.
  assert 'No session file found' not in done.stderr, done.stderr[-3000:]
  assert 'Discarding unparseable args' not in done.stderr, done.stderr[-3000:]

  expected = wordcount.run_wordcount(
    wordcount.DEFAULT_INPUT, str(tmp_path / 'direct' / 'counts'), ['--runner=DirectRunner']
  )
  assert wordcount.read_counts(prefix) == expected


def test_refract_run_passes_the_pipeline_exit_status(refract_bin, tmp_path):
  failing = tmp_path / 'fails.py'
  failing.write_text('import sys\nsys.exit(3)\n')
  env = dict(os.environ, REFRACT_PYTHON=sys.executable)
  done = subprocess.run(
    [refract_bin, 'run', str(failing)], capture_output=True, text=True, timeout=60, env=env
  )
  assert done.returncode == 3, done.stderr
  assert 'submitted no job' in done.stderr, done.stderr


def test_refract_run_does_not_hand_its_pipeline_to_another_program(refract_bin, tmp_path):
  """What listens on the default port 8073 gets the pipeline only if it is
  a Refract server of this user: here it is some other program, so
  `refract run` starts a server of its own."""
  other = socket.socket()
  other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    other.bind(('127.0.0.1', 8073))
  except OSError:
    pytest.skip('port 8073 is in use here')
  other.listen(8)
  try:
    prefix = str(tmp_path / 'counts')
    env = dict(os.environ, REFRACT_PYTHON=sys.executable)
    done = subprocess.run(
      [refract_bin, 'run', wordcount.__file__, '--output', prefix, '--top', '1'],
      capture_output=True,
      text=True,
      timeout=180,
      env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'is not a Refract server' in done.stderr, done.stderr[-3000:]
    assert 'server for this run' in done.stderr, done.stderr[-3000:]
  finally:
    other.close()


def test_refract_run_names_the_server_it_is_given_and_refuses_others(
  refract_bin, refract_server, tmp_path
):
  env = dict(os.environ, REFRACT_PYTHON=sys.executable)
  prefix = str(tmp_path / 'counts')
  done = subprocess.run(
    [
      refract_bin,
      'run',
      '--job_endpoint',
      refract_server.endpoint,
      wordcount.__file__,
      '--output',
      prefix,
      '--top',
      '1',
    ],
    capture_output=True,
    text=True,
    timeout=180,
    env=env,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert re.search(
    r'running on the Refract \S+ server at %s' % re.escape(refract_server.endpoint), done.stderr
  ), done.stderr[-3000:]

  # Something else listens there: refused, saying how to run there anyway.
  other = socket.socket()
  other.bind(('127.0.0.1', 0))
  other.listen(8)
  try:
    endpoint = '127.0.0.1:%d' % other.getsockname()[1]
    done = subprocess.run(
      [refract_bin, 'run', '--job_endpoint', endpoint, wordcount.__file__, '--output', prefix],
      capture_output=True,
      text=True,
      timeout=60,
      env=env,
    )
    assert done.returncode != 0, done.stderr[-3000:]
    assert 'is not a Refract server' in done.stderr, done.stderr[-3000:]
    assert '--runner=PortableRunner --job_endpoint=%s' % endpoint in (done.stderr), done.stderr[
      -3000:
    ]
  finally:
    other.close()


MAIN_SESSION_PIPELINE = '''
import argparse
import logging
import os
import re
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

# A global of the main module: with dill, a worker finds it only in the
# pickled main session the pipeline stages (--save_main_session).
WORD = re.compile(r"[a-z]+")


def words(line):
  return WORD.findall(line)


def tag(word):
  # Reaches the pipeline's output through the runner's log service.
  logging.warning("REFRACT-LOG-PROBE %s from worker %d", word, os.getpid())
  # The worker's pid, and what its parent is: the fork server.
  with open("/proc/%d/cmdline" % os.getppid(), "rb") as f:
    parent = f.read().replace(b"\\0", b" ").decode()
  return "%d %s %s" % (os.getpid(), word, "forked" if " serve " in parent
                       else "booted")


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("--output", required=True)
  args, rest = parser.parse_known_args(sys.argv[1:])
  output = args.output
  print("CLIENT_PID %d" % os.getpid())
  with beam.Pipeline(options=PipelineOptions(rest)) as p:
    _ = (p | beam.Create(["the cat", "a dog", "the end"])
         | beam.FlatMap(words) | beam.Map(tag)
         | beam.io.WriteToText(output, num_shards=1))
'''


def test_refract_run_starts_worker_processes_that_load_the_main_session(refract_bin, tmp_path):
  """Without flags, `refract run` runs the SDK in worker processes (not
  threads of the pipeline's process), forked from a server of the
  pipeline's own interpreter that imported Beam once; a pipeline that needs
  its main session there still works."""
  pipeline = tmp_path / 'main_session.py'
  pipeline.write_text(MAIN_SESSION_PIPELINE)
  output = str(tmp_path / 'out')
  env = dict(os.environ, REFRACT_PYTHON=sys.executable)
  done = subprocess.run(
    [
      refract_bin,
      'run',
      str(pipeline),
      '--output',
      output,
      '--save_main_session',
      '--pickle_library=dill',
    ],
    capture_output=True,
    text=True,
    timeout=240,
    env=env,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  client = [line for line in done.stdout.splitlines() if line.startswith('CLIENT_PID ')]
  assert len(client) == 1, done.stdout
  client_pid = int(client[0].split()[1])
  with open(output + '-00000-of-00001') as f:
    rows = [line.split() for line in f.read().splitlines()]
  assert sorted(w for _, w, _ in rows) == ['a', 'cat', 'dog', 'end', 'the', 'the']
  assert all(int(pid) != client_pid for pid, _, _ in rows), (client_pid, rows)
  # Forked from the run's fork server, which imported Beam once.
  assert all(how == 'forked' for _, _, how in rows), rows
  # Their log lines reach the runner's log service, and from there the job's
  # messages, which the pipeline's client prints ("[worker transform] ...").
  probes = re.findall(r'\] REFRACT-LOG-PROBE (\w+) from worker (\d+)', done.stderr)
  assert sorted(w for w, _ in probes) == sorted(w for _, w, _ in rows), done.stderr[-3000:]
  assert {int(pid) for _, pid in probes} == {int(pid) for pid, _, _ in rows}
  # Once: the run's own server does not print them too.
  assert done.stderr.count('REFRACT-LOG-PROBE') == len(rows), done.stderr[-3000:]
  assert 'Logging client failed' not in done.stderr, done.stderr[-3000:]
  assert 'Discarding unparseable args' not in done.stderr, done.stderr[-3000:]
  # The submission environment's `pip freeze` was skipped.
  assert 'submission_environment_dependencies' not in done.stderr


def test_refract_run_workers_import_modules_beside_the_script(refract_bin, tmp_path):
  """A module next to the pipeline's script imports in the pipeline
  (Python puts the script's directory first on its path) and so is pickled
  by reference: the workers find it there too, wherever `refract run` was
  started from."""
  project = tmp_path / 'project'
  project.mkdir()
  (project / 'helper.py').write_text('def shout(word):\n  return word.upper()\n')
  (project / 'pipeline.py').write_text(
    'import argparse\n'
    'import apache_beam as beam\n'
    'from apache_beam.options.pipeline_options import PipelineOptions\n'
    'import helper\n'
    'parser = argparse.ArgumentParser()\n'
    'parser.add_argument("--output", required=True)\n'
    'args, rest = parser.parse_known_args()\n'
    'with beam.Pipeline(options=PipelineOptions(rest)) as p:\n'
    '  _ = (p | beam.Create(["a", "b"]) | beam.Map(helper.shout)\n'
    '       | beam.io.WriteToText(args.output, num_shards=1))\n'
  )
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  output = str(tmp_path / 'out')
  env = dict(os.environ, REFRACT_PYTHON=sys.executable)
  done = subprocess.run(
    [refract_bin, 'run', str(project / 'pipeline.py'), '--output', output],
    capture_output=True,
    text=True,
    timeout=240,
    env=env,
    cwd=elsewhere,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  with open(output + '-00000-of-00001') as f:
    assert sorted(f.read().split()) == ['A', 'B']


SLOW_PIPELINE = '''
import argparse
import os
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

MARKS = None


def slow(x):
  # Says which worker process runs it, then takes its time.
  with open(os.path.join(MARKS, str(os.getpid())), "w") as f:
    f.write(str(x))
  time.sleep(300)
  return x


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("--marks", required=True)
  args, rest = parser.parse_known_args()
  MARKS = args.marks
  with beam.Pipeline(options=PipelineOptions(rest)) as p:
    _ = p | beam.Create(list(range(4))) | beam.Reshuffle() | beam.Map(slow)
'''


def start_slow_run(refract_bin, tmp_path, extra_args=()):
  """`refract run` of a pipeline whose workers block, in a process group
  of its own as a terminal's foreground job is; returns it once a worker
  runs, with the directory where workers left their pids."""
  pipeline = tmp_path / 'slow.py'
  pipeline.write_text(SLOW_PIPELINE)
  marks = tmp_path / 'marks'
  marks.mkdir()
  scratch = tmp_path / 'tmp'
  scratch.mkdir()
  env = dict(os.environ, REFRACT_PYTHON=sys.executable, TMPDIR=str(scratch))
  run = subprocess.Popen(
    [refract_bin, 'run', *extra_args, str(pipeline), '--marks', str(marks)],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=env,
    start_new_session=True,
  )
  deadline = time.monotonic() + 120
  while not os.listdir(marks):
    if run.poll() is not None or time.monotonic() > deadline:
      run.kill()
      pytest.fail('no worker ran: %s' % run.communicate()[1][-3000:])
    time.sleep(0.1)
  return run, marks, scratch


def test_ctrl_c_stops_the_run_its_job_and_its_workers(refract_bin, tmp_path):
  """Ctrl-C sends SIGINT to the terminal's foreground group: `refract
  run`, the pipeline's process and the fork server. The job is cancelled,
  the workers, the fork server and the embedded server stop, nothing of
  theirs is left in the temporary directory, and the exit status is a
  SIGINT's (130)."""
  run, marks, scratch = start_slow_run(refract_bin, tmp_path)
  os.killpg(run.pid, signal.SIGINT)
  _, err = run.communicate(timeout=60)
  assert run.returncode == 130, err[-3000:]
  assert re.search(r'refract: cancelled job-\w+', err), err[-3000:]
  workers = [int(pid) for pid in os.listdir(marks)]
  deadline = time.monotonic() + 10
  while any(alive(pid) for pid in workers):
    assert time.monotonic() < deadline, 'workers left: %s' % workers
    time.sleep(0.1)
  # Stopped workers are not retried or replaced.
  assert 'retrying' not in err and 'replacement' not in err, err[-3000:]
  assert not [n for n in os.listdir(scratch) if n.startswith('refract')], os.listdir(scratch)


def test_sigterm_stops_the_pipeline_and_cancels_its_job_on_a_server(
  refract_bin, refract_server, tmp_path
):
  """A SIGTERM to `refract run` alone (a supervisor's): it passes it on to
  the pipeline's process and cancels the job on the server it ran on."""
  run, marks, _ = start_slow_run(refract_bin, tmp_path, ['--job_endpoint', refract_server.endpoint])
  run.send_signal(signal.SIGTERM)
  _, err = run.communicate(timeout=60)
  assert run.returncode == 143, err[-3000:]
  job = re.search(r'refract: cancelled (job-\w+)', err)
  assert job, err[-3000:]
  status = subprocess.run(
    [refract_bin, 'status', job.group(1), '--job_endpoint', refract_server.endpoint],
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert status.stdout.splitlines()[0] in (
    '%s: CANCELLED' % job.group(1),
    '%s: CANCELLING' % job.group(1),
  ), status.stdout + status.stderr


def test_a_killed_run_takes_its_pipeline_process_with_it(refract_bin, refract_server, tmp_path):
  """`refract run` killed outright (SIGKILL: nothing of it runs) cannot
  stop the pipeline's process itself; the kernel does, so no client is
  left behind waiting on a server that is gone."""
  run, _, _ = start_slow_run(refract_bin, tmp_path, ['--job_endpoint', refract_server.endpoint])
  pipelines = [
    pid
    for pid in children_by_parent().get(run.pid, [])
    if 'slow.py' in open('/proc/%d/cmdline' % pid).read()
  ]
  assert len(pipelines) == 1, pipelines
  run.kill()
  run.communicate(timeout=60)
  deadline = time.monotonic() + 10
  while alive(pipelines[0]):
    assert time.monotonic() < deadline, 'the pipeline outlived refract run'
    time.sleep(0.1)
