"""Backpressure with the real SDK: a streaming source faster than its sink.

An unbounded splittable source emits 1 KiB records as fast as it can, a
`Reshuffle` (which Refract runs as a pass-through stage) sits between it and
a sink that sleeps per record. The source must be held back by the sink's
queue — seen through the Reshuffle — so that what waits stays near the
stage's share of `--memory_budget` instead of growing with the run (or
spilling to disk), and the hold-back shows as throttled time.
"""

import re
import time
import urllib.request

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from endless_source import Records
from refract_testlib import ui_server

RUN_SECONDS = 25


def slow_sink(record):
  time.sleep(0.002)
  return len(record)


def stage_metric(text, name, stage_prefix):
  """The value of `name` for the one stage whose name starts with
  `stage_prefix` (0 if absent)."""
  for line in text.splitlines():
    m = re.match(r'%s\{[^}]*stage="([^"]*)"[^}]*\} (\S+)$' % name, line)
    if m and m.group(1).startswith(stage_prefix):
      return float(m.group(2))
  return 0.0


def test_a_slow_sink_holds_a_fast_source_back_through_a_reshuffle(
    request, refract_bin, tmp_path):
  server, ui = ui_server(
      refract_bin, str(tmp_path / 'refract.log'),
      extra_args=['--memory_budget', '16m'])
  server.wait_ready()
  request.addfinalizer(server.stop)
  options = PipelineOptions(server.portable_args('--streaming'))
  p = beam.Pipeline(options=options)
  _ = (
      p | beam.Impulse() | 'Source' >> beam.ParDo(Records(200))
      | beam.Reshuffle() | 'Sink' >> beam.Map(slow_sink))
  result = p.run()
  try:
    time.sleep(RUN_SECONDS)
    with urllib.request.urlopen(ui + '/metrics', timeout=10) as response:
      text = response.read().decode()
  finally:
    result.cancel()
  produced = stage_metric(
      text, 'refract_stage_output_elements_total', 'Source/Process')
  taken = stage_metric(text, 'refract_stage_elements_total', 'Sink')
  throttled = stage_metric(
      text, 'refract_stage_throttled_seconds_total', 'Source/Process')
  spilled = stage_metric(text, 'refract_stage_spilled_bytes_total', 'Sink')
  assert taken > 1000, (produced, taken, server.log_tail())
  # The sink's share of 16 MiB over the job's stages is a few thousand
  # 1 KiB records; a source bundle adds 200. Unchecked, the source runs
  # tens of thousands ahead and the sink's queue spills to disk.
  assert produced - taken <= 8000, (produced, taken)
  assert spilled == 0, spilled
  assert throttled > 1.0, (throttled, produced, taken)
