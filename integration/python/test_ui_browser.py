"""The web UI in a real browser (headless Chromium) while a streaming
pipeline runs: the page shows the job, its stages with a watermark that
moves, and the harness's log lines; then the job is drained through the
UI's own route."""

import json
import logging
import os
import re
import threading
import time
import urllib.request

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from refract_browser import page_dom
from refract_browser import screenshot
from refract_testlib import ui_server

# PROCESS workers: their log lines travel over the Fn API's logging service
# (a LOOPBACK worker logs to the submitting process's console instead).
BOOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'python_boot.sh')


def tick(x):
  logging.getLogger('refract.ui.test').warning('tick %s', x)
  return ('k', 1)


def get(url, data=None):
  # Actions (POSTs) carry the header the page's own scripts send.
  headers = {'X-Refract-Action': '1'} if data is not None else {}
  request = urllib.request.Request(url, data=data, headers=headers)
  with urllib.request.urlopen(request, timeout=10) as response:
    return json.loads(response.read().decode())


def output_watermarks(dom):
  return re.findall(r'class="output-watermark">output watermark: ([^<]*)<', dom)


def test_browser_sees_job_stages_moving_watermark_and_logs(request, refract_bin, tmp_path):
  server, ui = ui_server(refract_bin, tmp_path / 'refract-serve.log')
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    args = [
      a for a in server.portable_args('--streaming') if not a.startswith('--environment_type')
    ]
    options = PipelineOptions(
      args
      + [
        '--environment_type=PROCESS',
        '--environment_config=' + json.dumps({'command': BOOT}),
      ]
    )
    p = beam.Pipeline(options=options)
    _ = (
      p
      | PeriodicImpulse(fire_interval=0.2, apply_windowing=True)
      | 'Tick' >> beam.Map(tick)
      | beam.WindowInto(window.FixedWindows(1))
      | beam.GroupByKey()
    )
    result = {}
    runner = threading.Thread(target=lambda: result.update(r=p.run()))
    runner.start()

    deadline = time.monotonic() + 60
    job = None
    while time.monotonic() < deadline:
      running = [j for j in get(ui + '/api/jobs') if j['state'] == 'RUNNING']
      if running:
        job = running[0]['id']
        stages = get(ui + '/api/jobs/' + job)['stages']
        if any(isinstance(s['output_watermark'], int) for s in stages):
          break
      time.sleep(0.5)
    assert job, 'no running job'

    first = page_dom('%s/#%s' % (ui, job))
    # Two samples of the stages' history make a line in their charts.
    while time.monotonic() < deadline:
      stages = get(ui + '/api/jobs/' + job)['stages']
      if any(len(s['history']) >= 2 for s in stages):
        break
      time.sleep(0.5)
    second = page_dom('%s/#%s' % (ui, job))
    screenshot('%s/#%s' % (ui, job), 'streaming-job')

    # The job list and the job's view.
    assert job in first and 'RUNNING' in first, first[-3000:]
    assert 'id="stage-0"' in first, first[-3000:]
    assert 'Tick' in first, first[-3000:]
    # Event time moves on: some stage's output watermark changed.
    before, after = output_watermarks(first), output_watermarks(second)
    assert before and len(before) == len(after), (before, after)
    assert before != after, (before, after)
    # The harness's log lines reach the page, with the transform they came from.
    assert 'tick' in second, second[-3000:]
    # Each stage charts its last minutes: throughput, watermark lag, backlog.
    for chart in ('throughput-chart', 'lag-chart', 'backlog-chart'):
      assert 'class="chart %s"' % chart in second, second[-3000:]
    assert '<polyline' in second, second[-3000:]
    # The user's transforms, by their names.
    assert 'class="node' in second and '>Tick<' in second, second[-3000:]

    state = get(ui + '/api/jobs/%s/drain' % job, data=b'')
    assert state['state'] in ('DRAINING', 'DONE'), state
    runner.join(timeout=60)
    assert 'r' in result
    result['r'].wait_until_finish(duration=60000)
    assert get(ui + '/api/jobs/' + job)['state'] == 'DONE'
  finally:
    server.stop()
