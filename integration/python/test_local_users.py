"""Another user of this machine cannot use the server `RefractRunner`
starts, tried with Beam's own Python client.

`runner/tests/local_users.rs` shows at the TCP level that every port of a
server closes other users' connections unread. Here the caller is a real
`PortableRunner` submitting a real pipeline: once as this user, which runs,
and once as a uid made up by the test, which must fail without the server
seeing a job. The client imports Beam as root and then drops to the other
uid (the virtualenv lives under root's home, which that uid cannot read),
so every socket it opens is the other user's.

Switching uid needs root; CI runs the tests as root.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import grpc
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

HERE = os.path.dirname(os.path.abspath(__file__))
WHEEL_PACKAGE = os.path.join(HERE, '..', 'wheel', 'python')

# A uid no account has; the kernel tells sockets apart by uid alone.
OTHER_UID = 40_124

CLIENT = textwrap.dedent("""\
  import os
  import sys
  import tempfile

  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions

  warm_endpoint, endpoint, uid = sys.argv[1], sys.argv[2], int(sys.argv[3])


  def run(job_endpoint):
    options = PipelineOptions([
      '--runner=PortableRunner',
      '--job_endpoint=' + job_endpoint,
      '--job_server_timeout=5',
      '--environment_type=LOOPBACK',
    ])
    with beam.Pipeline(options=options) as p:
      _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2)


  # A first run as this user, on another server, loads every module the
  # client needs while the virtualenv is readable (and shows the client
  # works); its connections are to that server only.
  run(warm_endpoint)
  print('WARM RAN', flush=True)
  # The other user's own temporary directory: this user's are private.
  own_tmp = os.path.join(os.getcwd(), 'other-user-tmp')
  os.mkdir(own_tmp, 0o700)
  os.chown(own_tmp, uid, uid)
  os.setgroups([])
  os.setgid(uid)
  os.setuid(uid)
  os.environ['TMPDIR'] = own_tmp
  tempfile.tempdir = own_tmp
  try:
    run(endpoint)
  except Exception as error:  # noqa: BLE001 - the test reads what failed
    print('FAILED', type(error).__name__, str(error)[:300], flush=True)
    sys.exit(3)
  print('RAN', flush=True)
""")


def run_client(warm_endpoint, endpoint, home):
  """Runs the client in `home`: its exit code and output."""
  done = subprocess.run(
    [sys.executable, '-c', CLIENT, warm_endpoint, endpoint, str(OTHER_UID)],
    capture_output=True,
    text=True,
    timeout=180,
    cwd=home,
    env=dict(os.environ, HOME=str(home), TMPDIR=str(home)),
    check=False,
  )
  return done.returncode, done.stdout + done.stderr[-3000:]


def job_names(endpoint):
  with grpc.insecure_channel(endpoint) as channel:
    jobs = beam_job_api_pb2_grpc.JobServiceStub(channel).GetJobs(
      beam_job_api_pb2.GetJobsRequest(), timeout=10
    )
  return [job.job_name for job in jobs.job_info]


@pytest.fixture
def runners_server(refract_bin):
  """The server `refract_beam.RefractRunner` starts, as it starts it."""
  sys.path.insert(0, WHEEL_PACKAGE)
  try:
    from refract_beam.runner import RefractJobServer
  finally:
    sys.path.remove(WHEEL_PACKAGE)

  class Recorded(RefractJobServer):
    """Keeps the endpoint the runner hands its client."""

    def subprocess_cmd_and_endpoint(self):
      cmd, self.endpoint = super().subprocess_cmd_and_endpoint()
      return cmd, self.endpoint

  server = Recorded(PipelineOptions([f'--refract_location={refract_bin}']))
  server.start()
  try:
    yield server.endpoint
  finally:
    server.stop()


def test_another_users_beam_client_cannot_submit_to_the_runners_server(
  runners_server, refract_server
):
  if os.geteuid() != 0:
    pytest.skip('switching to another uid needs root')
  # Not under pytest's own temporary root, which only root may enter.
  home = tempfile.mkdtemp(prefix='refract-other-user-')
  os.chmod(home, 0o755)
  try:
    code, out = run_client(refract_server.endpoint, runners_server, home)
  finally:
    shutil.rmtree(home, ignore_errors=True)
  assert 'WARM RAN' in out, out
  assert code == 3, out
  failed = next(line for line in out.splitlines() if line.startswith('FAILED'))
  # Beam's client gives up waiting for the job service to become ready.
  assert 'Timeout' in failed or 'UNAVAILABLE' in failed, out
  # The server saw no job, and answers its own user (this GetJobs).
  assert job_names(runners_server) == []
  # The same client, as this user, was served (by the warm-up server).
  assert job_names(refract_server.endpoint) == ['job']
