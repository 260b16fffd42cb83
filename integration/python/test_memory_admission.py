"""One memory budget for the whole server: a job that would take the
server past --memory_budget waits in STARTING, saying why, and starts
once a running job ends."""

import threading
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.periodicsequence import PeriodicImpulse
import grpc
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.portability.api import beam_job_api_pb2_grpc

from refract_testlib import RefractServer
from refract_testlib import job_messages
from refract_testlib import job_state


def jobs(endpoint):
  with grpc.insecure_channel(endpoint) as channel:
    return (
      beam_job_api_pb2_grpc.JobServiceStub(channel)
      .GetJobs(beam_job_api_pb2.GetJobsRequest(), timeout=10)
      .job_info
    )


def start_streaming_job(server):
  """Submits an endless streaming job; its id once it was run."""
  before = {j.job_id for j in jobs(server.endpoint)}
  options = PipelineOptions(server.portable_args('--streaming'))
  p = beam.Pipeline(options=options)
  _ = p | PeriodicImpulse(fire_interval=0.5) | beam.Map(lambda x: x)
  threading.Thread(target=p.run, daemon=True).start()
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    new = [j for j in jobs(server.endpoint) if j.job_id not in before]
    if new and new[0].state != beam_job_api_pb2.JobState.STOPPED:
      return new[0].job_id
    time.sleep(0.2)
  raise AssertionError('no job was submitted')


def wait_for(endpoint, job_id, state, timeout_s=60):
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if job_state(endpoint, job_id) == state:
      return
    time.sleep(0.2)
  raise AssertionError('job %s is %s, not %s' % (job_id, job_state(endpoint, job_id), state))


def test_a_job_past_the_server_budget_waits_for_one_to_end(request, refract_bin, tmp_path):
  server = RefractServer(
    refract_bin,
    tmp_path / 'refract.log',
    extra_args=['--memory_budget', '64m', '--job_memory_budget', '64m', '--serve_http=false'],
  )
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    first = start_streaming_job(server)
    wait_for(server.endpoint, first, 'RUNNING')
    second = start_streaming_job(server)
    time.sleep(2)
    assert job_state(server.endpoint, second) == 'STARTING'
    said = job_messages(server.endpoint, second)
    assert any('waiting for memory' in m for m in said), said
    with grpc.insecure_channel(server.endpoint) as channel:
      beam_job_api_pb2_grpc.JobServiceStub(channel).Cancel(
        beam_job_api_pb2.CancelJobRequest(job_id=first), timeout=10
      )
    wait_for(server.endpoint, second, 'RUNNING')
    with grpc.insecure_channel(server.endpoint) as channel:
      beam_job_api_pb2_grpc.JobServiceStub(channel).Cancel(
        beam_job_api_pb2.CancelJobRequest(job_id=second), timeout=10
      )
    wait_for(server.endpoint, second, 'CANCELLED')
  finally:
    server.stop()
