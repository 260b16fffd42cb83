"""Backpressure with the real SDK: a streaming source faster than its sink.

An unbounded splittable source emits 1 KiB records as fast as it can, a
`Reshuffle` (which Refract runs as a pass-through stage) sits between it and
a sink that sleeps per record. The source must be held back by the sink's
queue — seen through the Reshuffle — so that what waits stays near the
stage's share of `--memory_budget` instead of growing with the run (or
spilling to disk), and the hold-back shows as throttled time.

A Python worker runs one bundle at a time, so the source can get ahead only
where the sink cannot use every worker: here two workers and a stateful sink
whose records all have one key (one bundle at a time), so the source runs on
the other worker. On one worker source and sink take turns and the source
never gets ahead (the second test).
"""

import re
import time
import urllib.request

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.userstate import CombiningValueStateSpec

from splittable_sources import Records
from refract_testlib import ui_server

RUN_SECONDS = 25


class SlowSink(beam.DoFn):
  """2 ms per record; counts its records in state (one key: one bundle at a
  time)."""

  SEEN = CombiningValueStateSpec('seen', sum)

  def process(self, kv, seen=beam.DoFn.StateParam(SEEN)):
    time.sleep(0.002)
    seen.add(1)
    yield len(kv[1])


def stage_metric(text, name, stage_prefix):
  """The value of `name` for the one stage whose name starts with
  `stage_prefix` (0 if absent)."""
  for line in text.splitlines():
    m = re.match(r'%s\{[^}]*stage="([^"]*)"[^}]*\} (\S+)$' % name, line)
    if m and m.group(1).startswith(stage_prefix):
      return float(m.group(2))
  return 0.0


def run_source_into_slow_sink(request, refract_bin, tmp_path, *args):
  """Runs the endless source into the slow sink for RUN_SECONDS on a server
  with a 16 MiB budget; returns (records produced, records the sink took,
  seconds the source was throttled, bytes the sink's queue spilled, the
  server)."""
  server, ui = ui_server(
    refract_bin, str(tmp_path / 'refract.log'), extra_args=['--memory_budget', '16m']
  )
  server.wait_ready()
  request.addfinalizer(server.stop)
  options = PipelineOptions(server.portable_args('--streaming', *args))
  p = beam.Pipeline(options=options)
  _ = (
    p
    | beam.Impulse()
    | 'Source' >> beam.ParDo(Records(200))
    | 'OneKey' >> beam.Map(lambda record: (0, record))
    | beam.Reshuffle()
    | 'Sink' >> beam.ParDo(SlowSink())
  )
  result = p.run()
  try:
    time.sleep(RUN_SECONDS)
    with urllib.request.urlopen(ui + '/metrics', timeout=10) as response:
      text = response.read().decode()
  finally:
    result.cancel()
  return (
    stage_metric(text, 'refract_stage_output_elements_total', 'Source/Process'),
    stage_metric(text, 'refract_stage_elements_total', 'Sink'),
    stage_metric(text, 'refract_stage_throttled_seconds_total', 'Source/Process'),
    stage_metric(text, 'refract_stage_spilled_bytes_total', 'Sink'),
    server,
  )


def test_a_slow_sink_holds_a_fast_source_back_through_a_reshuffle(request, refract_bin, tmp_path):
  produced, taken, throttled, spilled, server = run_source_into_slow_sink(
    request, refract_bin, tmp_path, '--sdk_worker_parallelism=2'
  )
  assert taken > 1000, (produced, taken, server.log_tail())
  # The sink's share of 16 MiB over the job's stages is a few thousand
  # 1 KiB records; a source bundle adds 200. Unchecked, the source runs
  # tens of thousands ahead and the sink's queue spills to disk.
  assert produced - taken <= 8000, (produced, taken)
  assert spilled == 0, spilled
  assert throttled > 1.0, (throttled, produced, taken)


def test_on_one_worker_a_fast_source_and_a_slow_sink_take_turns(request, refract_bin, tmp_path):
  produced, taken, _, spilled, server = run_source_into_slow_sink(request, refract_bin, tmp_path)
  assert taken > 1000, (produced, taken, server.log_tail())
  # The sink takes what waits each time the source's bundle ends: the
  # source is at most a bundle or two ahead.
  assert produced - taken <= 1000, (produced, taken)
  assert spilled == 0, spilled
