"""A worker that stops answering (SIGSTOP: its process is there, its
sockets are open, nothing moves) is declared lost within
--worker_liveness_timeout: its connections are closed for want of answers
to keepalive pings, its bundles are retried on the other worker, the job
is told, and the job finishes with every element processed once."""

import datetime
import json
import os
import signal
import subprocess
import threading
import time

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from refract_testlib import RefractServer
from refract_testlib import committed_counter

HERE = os.path.dirname(os.path.abspath(__file__))
BOOT = os.path.join(os.path.dirname(HERE), 'python_boot.sh')
ELEMENTS = 400
LIVENESS_S = 4


def slow(x):
  Metrics.counter('liveness', 'done').inc()
  time.sleep(0.05)
  return x


def worker_pids(server):
  found = subprocess.run(
    ['pgrep', '-f', '-s', str(server.proc.pid), 'sdk_worker_main'], capture_output=True, text=True
  )
  return [int(p) for p in found.stdout.split()]


def test_a_stopped_worker_is_declared_lost_and_its_bundles_run_elsewhere(
  request, refract_bin, tmp_path
):
  server = RefractServer(
    refract_bin,
    tmp_path / 'refract.log',
    extra_args=['--worker_liveness_timeout', '%ds' % LIVENESS_S, '--serve_http=false'],
  )
  request.node.refract_processes = [server]
  stopped = []
  try:
    server.wait_ready()
    args = [a for a in server.portable_args() if not a.startswith('--environment_type')]
    options = PipelineOptions(
      args
      + [
        '--environment_type=PROCESS',
        '--environment_config=' + json.dumps({'command': BOOT}),
        '--sdk_worker_parallelism=2',
      ]
    )
    p = beam.Pipeline(options=options)
    _ = p | beam.Create(list(range(ELEMENTS))) | beam.Reshuffle() | 'Slow' >> beam.Map(slow)
    result = {}
    runner = threading.Thread(target=lambda: result.update(r=p.run()), daemon=True)
    runner.start()

    # Both workers up and at work, then one stops for good.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(worker_pids(server)) < 2:
      time.sleep(0.2)
    pids = worker_pids(server)
    assert len(pids) >= 2, server.log_tail()
    time.sleep(2)
    os.kill(pids[0], signal.SIGSTOP)
    stopped.append(pids[0])
    stopped_at = time.time()

    runner.join(timeout=60)
    assert 'r' in result, server.log_tail()
    r = result['r']
    r.wait_until_finish(duration=180 * 1000)
    assert r.state == 'DONE', server.log_tail()
    assert committed_counter(server.endpoint, r._job_id, 'done') == ELEMENTS
    # Declared lost within the bound (a ping after half of it without
    # traffic, the other half to answer), not when the job ended anyway.
    log = server.log_tail(1 << 22)
    closed = [
      line for line in log.splitlines() if 'worker link closed' in line and 'declared lost' in line
    ]
    assert closed, log[-4000:]
    at = (
      datetime.datetime.strptime(closed[0].split()[0][:26], '%Y-%m-%dT%H:%M:%S.%f')
      .replace(tzinfo=datetime.timezone.utc)
      .timestamp()
    )
    assert 0 < at - stopped_at <= LIVENESS_S + 1.5, (at - stopped_at, closed[0])
    # The job was told: its bundle failed and was retried.
    messages = subprocess.run(
      [refract_bin, 'logs', r._job_id, '--job_endpoint', server.endpoint],
      capture_output=True,
      text=True,
      timeout=30,
    ).stdout
    assert 'declared lost' in messages, messages[-3000:]
  finally:
    for pid in stopped:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    server.stop()
