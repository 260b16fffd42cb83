"""Draining a running streaming job, through the Job API and the CLI.

A PeriodicImpulse with no stop time never ends by itself. `refract drain
JOB` asks the job service to drain it: the splittable source truncates its
restriction, the watermark reaches the end of time, the hour-long window
flushes its one pane, and the job finishes DONE.
"""

import subprocess
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse


def record(path):
  def append(kv):
    with open(path, 'a') as f:
      f.write('%s %d\n' % kv)

  return append


def test_drain_stops_sources_and_flushes_windows(refract_server, refract_bin, tmp_path):
  out = str(tmp_path / 'panes.txt')
  options = PipelineOptions(refract_server.portable_args() + ['--streaming'])
  p = beam.Pipeline(options=options)
  _ = (
    p
    | PeriodicImpulse(fire_interval=0.2)
    | beam.Map(lambda _: ('ticks', 1))
    | beam.WindowInto(window.FixedWindows(3600))
    | beam.CombinePerKey(sum)
    | beam.Map(record(out))
  )
  result = p.run()
  time.sleep(6)
  assert result.state == PipelineState.RUNNING, result.state
  drained = subprocess.run(
    [refract_bin, 'drain', result._job_id, '--job_endpoint', refract_server.endpoint],
    capture_output=True,
    text=True,
    timeout=30,
    check=True,
  )
  assert 'DRAINING' in drained.stdout, drained.stdout
  assert result.wait_until_finish(duration=60000) == PipelineState.DONE
  # Windows may split at the hour; every tick made it into some pane.
  with open(out) as f:
    panes = f.read().split()
  assert sum(int(n) for n in panes[1::2]) >= 10, panes
