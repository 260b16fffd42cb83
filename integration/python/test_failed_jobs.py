"""A failed job on a server with --state_dir keeps its record and latest
checkpoint: it is listed FAILED (also by a server started again on the
directory), `refract resume` runs it again from that checkpoint with every
number applied exactly once, and `refract delete` forgets it. Jobs that
finish or are cancelled leave nothing behind but their history file."""

import json
import os
import subprocess
import sys

from refract_testlib import committed_counter
from refract_testlib import durable_server
from refract_testlib import free_port
from refract_testlib import job_state
from refract_testlib import refract_cli
from refract_testlib import wait_for_end

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINE = os.path.join(HERE, 'resumable_pipeline.py')
BOOT = os.path.join(os.path.dirname(HERE), 'python_boot.sh')
NUMBERS = 3000
POISON_AT = 1000  # key 1


def expected():
  out = {}
  for i in range(NUMBERS):
    r = out.setdefault(i % 3, {'count': 0, 'total': 0})
    r['count'] += 1
    r['total'] += i
  return out


def read_results(output):
  results = {}
  for name in os.listdir(output):
    if name.endswith('.json'):
      with open(os.path.join(output, name)) as f:
        results[int(name[: -len('.json')])] = json.load(f)
  return results


def test_a_failed_job_is_kept_resumed_exactly_and_deleted(request, refract_bin, tmp_path):
  output = tmp_path / 'out'
  output.mkdir()
  poison = tmp_path / 'poison'
  poison.write_text('fail while this exists')
  state_dir = tmp_path / 'state'
  port = free_port()
  servers = [
    durable_server(refract_bin, state_dir, port, tmp_path / 'refract-0.log', interval='0s')
  ]
  request.node.refract_processes = servers
  try:
    done = subprocess.run(
      [
        sys.executable,
        PIPELINE,
        '--job_endpoint',
        servers[-1].endpoint,
        '--output',
        str(output),
        '--numbers',
        str(NUMBERS),
        '--poison',
        str(poison),
        '--poison_at',
        str(POISON_AT),
        '--boot',
        BOOT,
      ],
      capture_output=True,
      text=True,
      timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    job = done.stdout.strip().splitlines()[-1]
    assert wait_for_end(servers[-1], job) == 'FAILED', servers[-1].log_tail()

    status = refract_cli(refract_bin, servers[-1], 'status', job).stdout
    assert 'failed: ' in status and 'poisoned at %d' % POISON_AT in status, status
    assert 'refract resume %s' % job in status, status
    logs = refract_cli(refract_bin, servers[-1], 'logs', job).stdout
    assert 'record and latest checkpoint are kept' in logs, logs
    history = state_dir / 'history' / ('%s.json' % job)
    assert json.loads(history.read_text())['state'] == 'FAILED'

    # A server started again on the directory lists it, failed, and does
    # not run it.
    servers[-1].stop()
    servers.append(
      durable_server(refract_bin, state_dir, port, tmp_path / 'refract-1.log', interval='0s')
    )
    assert job_state(servers[-1].endpoint, job) == 'FAILED'
    listed = refract_cli(refract_bin, servers[-1], 'jobs').stdout
    assert any(line.split('\t')[:2] == [job, 'FAILED'] for line in listed.splitlines()), listed

    poison.unlink()
    resumed = refract_cli(refract_bin, servers[-1], 'resume', job).stdout
    assert resumed.startswith(job + ': '), resumed
    assert wait_for_end(servers[-1], job) == 'DONE', servers[-1].log_tail()
    logs = refract_cli(refract_bin, servers[-1], 'logs', job).stdout
    resumed_from = [line for line in logs.splitlines() if 'resumed from checkpoint' in line]
    assert resumed_from, logs
    assert read_results(output) == expected()
    # Counted with the state: none lost, none twice.
    assert committed_counter(servers[-1].endpoint, job, 'applied') == NUMBERS

    # Finished: nothing of it is kept but its history; delete forgets it.
    refract_cli(refract_bin, servers[-1], 'delete', job)
    gone = refract_cli(refract_bin, servers[-1], 'status', job, check=False)
    assert gone.returncode != 0 and 'no job' in gone.stderr, gone.stderr
    servers[-1].stop()
    servers.append(durable_server(refract_bin, state_dir, port, tmp_path / 'refract-2.log'))
    listed = refract_cli(refract_bin, servers[-1], 'jobs').stdout
    assert job not in listed, listed
  finally:
    for s in servers:
      s.stop()


def test_only_ended_jobs_can_be_deleted_and_only_failed_ones_resumed(refract_server, refract_bin):
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions

  p = beam.Pipeline(options=PipelineOptions(refract_server.portable_args()))
  _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x)
  result = p.run()
  result.wait_until_finish()
  job = result._job_id
  refused = refract_cli(refract_bin, refract_server, 'resume', job, check=False)
  assert refused.returncode != 0 and 'only a failed job' in refused.stderr, refused.stderr
  refract_cli(refract_bin, refract_server, 'delete', job)
  listed = refract_cli(refract_bin, refract_server, 'jobs').stdout
  assert job not in listed, listed
