"""The web UI's JSON routes and `/metrics` against a real job.

The numbers `/metrics` shows must be the ones the Job API's GetJobMetrics
returns for the same job, since both are views of the committed metrics.
"""

import json
import re
import urllib.request

import apache_beam as beam
import grpc
from apache_beam.metrics import Metrics
from apache_beam.metrics import monitoring_infos
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.portability.api import beam_job_api_pb2_grpc

from refract_testlib import ui_server


def seen(x):
  Metrics.counter('words', 'seen').inc()
  return x


def get(url):
  with urllib.request.urlopen(url, timeout=10) as response:
    return response.headers.get('Content-Type'), response.read().decode()


def job_api_element_counts(endpoint, job_id):
  with grpc.insecure_channel(endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    results = stub.GetJobMetrics(beam_job_api_pb2.GetJobMetricsRequest(job_id=job_id), timeout=10)
  return {
    info.labels['PCOLLECTION']: monitoring_infos.extract_counter_value(info)
    for info in results.metrics.committed
    if info.urn == monitoring_infos.ELEMENT_COUNT_URN
  }


def test_ui_lists_the_job_and_metrics_match_the_job_api(request, refract_bin, tmp_path):
  server, ui = ui_server(refract_bin, tmp_path / 'refract-serve.log')
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    p = beam.Pipeline(options=PipelineOptions(server.portable_args()))
    _ = p | beam.Create(['a', 'b', 'c']) | 'Count' >> beam.Map(seen)
    result = p.run()
    result.wait_until_finish()
    job = result._job_id

    kind, page = get(ui + '/')
    assert kind.startswith('text/html') and '<title>Refract</title>' in page

    _, body = get(ui + '/api/jobs')
    assert {'id': job, 'name': json.loads(body)[0]['name'], 'state': 'DONE'} in json.loads(body), (
      body
    )

    _, body = get(ui + '/api/jobs/' + job)
    details = json.loads(body)
    assert details['state'] == 'DONE', details
    assert any(m['labels'].get('NAME') == 'seen' and m['value'] == 3 for m in details['metrics']), (
      details
    )
    # The stage graph: every stage finished, the Count step fused somewhere.
    stages = details['stages']
    assert stages and all(s['output_watermark'] == '+inf' for s in stages), stages
    assert any('Count' in s['transforms'] for s in stages), stages
    assert sum(s['bundles_committed'] for s in stages) > 0, stages

    kind, text = get(ui + '/metrics')
    assert kind.startswith('text/plain'), kind
    assert 'refract_jobs{state="DONE"} 1' in text.splitlines(), text
    assert (
      'refract_user_counter_total{job="%s",transform="Count",namespace="words",name="seen"} 3' % job
    ) in text.splitlines(), text
    stage_lines = [
      line
      for line in text.splitlines()
      if line.startswith('refract_stage_output_watermark_ms{job="%s"' % job)
    ]
    assert stage_lines and all(line.endswith(' +Inf') for line in stage_lines), text
    scraped = {
      m.group(1): int(m.group(2))
      for m in re.finditer(
        r'^refract_pcollection_elements_total\{job="%s",pcollection="([^"]*)"\} (\d+)$'
        % re.escape(job),
        text,
        re.M,
      )
    }
    expected = job_api_element_counts(server.endpoint, job)
    assert expected and scraped == expected, (scraped, expected, text)
  finally:
    server.stop()
