"""OTLP export against a real OpenTelemetry Collector.

The collector is built from the Go module proxy by
integration/otel/build-collector.sh (its OTLP receiver and debug exporter);
the test reads back what the collector received from its detailed debug
output: the runner's per-stage metrics (matching `/metrics`), the bundle
duration histogram, job states, live workers, and a trace per job whose
bundle spans hang under the job's span.
"""

import os
import re
import time
import urllib.request

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from refract_testlib import RefractProcess, built_binary, free_port, ui_server

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(os.path.dirname(HERE), 'otel', 'build-collector.sh')

CONFIG = """
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%d
exporters:
  debug:
    verbosity: detailed
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    metrics:
      receivers: [otlp]
      exporters: [debug]
    traces:
      receivers: [otlp]
      exporters: [debug]
"""


def collector_binary():
  return built_binary('REFRACT_OTELCOL', BUILD)


def parse_debug_output(text):
  """(metric points, spans) from the debug exporter's detailed output.

  A metric point is a dict with `metric`, its attributes and `value` (or
  `count` for a histogram); a span is a dict with `name`, `trace`,
  `parent`, `id` and its attributes."""
  points, spans = [], []
  metric, current = None, None
  for line in text.splitlines():
    line = line.strip()
    if line.startswith('Span #'):
      current = {}
      spans.append(current)
    elif line.startswith(('NumberDataPoints #', 'HistogramDataPoints #')):
      current = {'metric': metric}
      points.append(current)
    elif line.startswith('Metric #') or line.startswith('ResourceMetrics #'):
      current = None
    elif m := re.match(r'-> Name: (\S+)$', line):
      metric, current = m.group(1), None
    elif current is None:
      continue
    elif m := re.match(r'-> ([\w.]+): \w+\((.*)\)$', line):
      current[m.group(1)] = m.group(2)
    elif m := re.match(r'(Trace ID|Parent ID|ID|Name)\s+: ?(.*)$', line):
      key = {'Trace ID': 'trace', 'Parent ID': 'parent', 'ID': 'id', 'Name': 'name'}[m.group(1)]
      current[key] = m.group(2).strip()
    elif m := re.match(r'(Value|Count): (\S+)$', line):
      current[m.group(1).lower()] = float(m.group(2))
  return points, spans


def seen(x):
  Metrics.counter('otlp', 'seen').inc()
  return x


def test_metrics_and_traces_reach_an_otlp_collector(request, refract_bin, tmp_path, monkeypatch):
  otlp_port = free_port()
  config = tmp_path / 'otelcol.yaml'
  config.write_text(CONFIG % otlp_port)
  collector = RefractProcess([collector_binary(), '--config', config], tmp_path / 'otelcol.log')
  monkeypatch.setenv('OTEL_METRIC_EXPORT_INTERVAL', '500')
  server, ui = ui_server(
    refract_bin,
    tmp_path / 'refract-serve.log',
    extra_args=['--otlp_endpoint', 'http://127.0.0.1:%d' % otlp_port],
  )
  request.node.refract_processes = [server, collector]
  try:
    deadline = time.monotonic() + 60
    while 'Everything is ready' not in collector.log_tail(100000):
      assert collector.proc.poll() is None, collector.log_tail()
      assert time.monotonic() < deadline, collector.log_tail()
      time.sleep(0.2)
    server.wait_ready()

    p = beam.Pipeline(options=PipelineOptions(server.portable_args()))
    _ = p | beam.Create(['a', 'b', 'c']) | 'Count' >> beam.Map(seen)
    result = p.run()
    result.wait_until_finish()
    job = result._job_id

    with urllib.request.urlopen(ui + '/metrics', timeout=10) as response:
      scrape = response.read().decode()
    scraped = {
      m.group(1): float(m.group(2))
      for m in re.finditer(
        r'^refract_stage_elements_total\{job="%s",stage="([^"]*)"\} (\S+)$' % job, scrape, re.M
      )
    }
    count_stage = [s for s in scraped if 'Count' in s.split('+')]
    assert len(count_stage) == 1, scrape
    count_stage = count_stage[0]

    def received():
      with open(tmp_path / 'otelcol.log', encoding='utf-8', errors='replace') as f:
        return parse_debug_output(f.read())

    def latest(points, metric, **attrs):
      values = [
        p for p in points if p['metric'] == metric and all(p.get(k) == v for k, v in attrs.items())
      ]
      return values[-1] if values else None

    deadline = time.monotonic() + 60
    while True:
      points, spans = received()
      elements = latest(
        points, 'refract.stage.elements.in', **{'beam.job.id': job, 'refract.stage': count_stage}
      )
      job_spans = [s for s in spans if s.get('name') == 'job' and s.get('beam.job.id') == job]
      if (
        elements
        and elements['value'] == scraped[count_stage]
        and job_spans
        and latest(points, 'refract.jobs', **{'beam.job.state': 'DONE'})
      ):
        break
      assert time.monotonic() < deadline, (
        'the collector did not receive the job\'s metrics and span; log:\n' + collector.log_tail()
      )
      time.sleep(0.5)

    # The same per-stage count as /metrics (3 elements into the Count stage).
    assert scraped[count_stage] == 3, scrape
    # Bundle durations, job states and live workers are exported too.
    histogram = latest(
      points, 'refract.stage.bundle.duration', **{'beam.job.id': job, 'refract.stage': count_stage}
    )
    assert histogram and histogram['count'] >= 1, histogram
    assert latest(points, 'refract.harnesses.live') is not None
    # One trace per job: the job's span, ended DONE, with its bundles'
    # spans (stage and worker attributes) under it.
    (job_span,) = job_spans
    assert job_span['beam.job.state'] == 'DONE', job_span
    bundles = [s for s in spans if s.get('name') == 'bundle' and s.get('parent') == job_span['id']]
    assert bundles, spans
    assert all(b['trace'] == job_span['trace'] for b in bundles), bundles
    assert any(b.get('refract.stage') == count_stage for b in bundles), bundles
    assert all(b.get('refract.worker', '').startswith(job) for b in bundles), bundles
  finally:
    server.stop()
    collector.stop()
