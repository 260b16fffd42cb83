"""The web UI as an attack surface: requests naming another host (DNS
rebinding), actions from other origins or without the UI's own header,
savepoints outside the savepoint directory, and a hostile page in a real
browser (headless Chromium) that tries to cancel a running job — all are
refused, and the job runs on. Secrets in pipeline options and log lines
are redacted where Refract shows them."""

import http.client
import http.server
import json
import logging
import os
import shutil
import subprocess
import threading
import time
import urllib.request

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.portability.api import beam_job_api_pb2_grpc
import grpc

from refract_testlib import free_port
from refract_testlib import ui_server

SECRET = 'hunter2-very-secret'
BOOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'python_boot.sh')


def send(ui, method, path, headers=None, body=None):
  """(status, text) of one request to the UI, with exactly `headers`."""
  host, port = ui[len('http://') :].split(':')
  conn = http.client.HTTPConnection(host, int(port), timeout=10)
  try:
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for name, value in (headers or {}).items():
      conn.putheader(name, value)
    if body is not None:
      conn.putheader('Content-Length', str(len(body)))
    conn.endheaders(body)
    response = conn.getresponse()
    return response.status, response.read().decode()
  finally:
    conn.close()


def job_state(ui, job):
  with urllib.request.urlopen('%s/api/jobs/%s' % (ui, job), timeout=10) as r:
    return json.loads(r.read())['state']


def slow(x):
  logging.getLogger('refract.guard.test').warning('connecting with password=%s', SECRET)
  time.sleep(0.05)
  return x


def start_endless_job(server, boot=BOOT):
  """A streaming job that runs until cancelled, on PROCESS workers (whose
  log lines reach the job's messages over the Fn API; a LOOPBACK worker
  logs to the submitting process instead), and its id."""
  args = [
    a
    for a in server.portable_args('--streaming', '--db_password=' + SECRET)
    if not a.startswith('--environment_type')
  ]
  options = PipelineOptions(
    args
    + [
      '--environment_type=PROCESS',
      '--environment_config=' + json.dumps({'command': boot}),
    ]
  )
  p = beam.Pipeline(options=options)
  from apache_beam.transforms.periodicsequence import PeriodicImpulse

  _ = p | PeriodicImpulse(fire_interval=0.2) | beam.Map(slow)
  result = {}
  runner = threading.Thread(target=lambda: result.update(r=p.run()), daemon=True)
  runner.start()
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    with grpc.insecure_channel(server.endpoint) as channel:
      jobs = (
        beam_job_api_pb2_grpc.JobServiceStub(channel)
        .GetJobs(beam_job_api_pb2.GetJobsRequest(), timeout=10)
        .job_info
      )
    running = [j for j in jobs if j.state == beam_job_api_pb2.JobState.RUNNING]
    if running:
      return running[0].job_id, running[0]
    time.sleep(0.3)
  pytest.fail('the job did not start')


ATTACK_PAGE = """<!doctype html><html><body><p id="out">start</p><script>
const target = "%(ui)s/api/jobs/%(job)s/cancel";
const out = document.getElementById("out");
const note = (s) => { out.textContent += " | " + s; };
(async () => {
  // With the UI's header: needs a CORS preflight, which is never approved.
  try { await fetch(target, {method: "POST", headers: {"X-Refract-Action": "1"}});
        note("header-sent"); } catch (e) { note("header-blocked"); }
  // A "simple" request a page may send anywhere: no custom header.
  try { await fetch(target, {method: "POST", mode: "no-cors", body: "x",
                             headers: {"Content-Type": "text/plain"}});
        note("simple-sent"); } catch (e) { note("simple-blocked"); }
  // Reading the job list across origins.
  try { const r = await fetch("%(ui)s/api/jobs"); note("read:" + (await r.text()).length); }
  catch (e) { note("read-blocked"); }
  // A form post, as a hostile page would make it.
  const form = document.createElement("form");
  form.method = "POST"; form.action = target; form.target = "sink";
  document.body.appendChild(form);
  const sink = document.createElement("iframe"); sink.name = "sink";
  document.body.appendChild(sink);
  form.submit();
  note("done");
})();
</script></body></html>"""


def serve_page(html):
  """An HTTP server on another port serving `html`: (url, server)."""
  body = html.encode()

  class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
      self.send_response(200)
      self.send_header('Content-Type', 'text/html')
      self.send_header('Content-Length', str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def log_message(self, *args):
      pass

  httpd = http.server.ThreadingHTTPServer(('127.0.0.1', free_port()), Handler)
  threading.Thread(target=httpd.serve_forever, daemon=True).start()
  return 'http://127.0.0.1:%d/' % httpd.server_address[1], httpd


def test_forged_hosts_foreign_origins_and_hostile_pages_are_refused(request, refract_bin, tmp_path):
  savepoints = tmp_path / 'savepoints'
  server, ui = ui_server(
    refract_bin, tmp_path / 'refract.log', extra_args=['--savepoint_dir', str(savepoints)]
  )
  request.node.refract_processes = [server]
  page = None
  try:
    server.wait_ready()
    job, info = start_endless_job(server)
    host = ui[len('http://') :]

    # DNS rebinding: a page at evil.example resolving to 127.0.0.1 sends
    # its own name as Host, and reads nothing.
    for path in ['/', '/api/jobs', '/api/jobs/%s/logs' % job, '/metrics']:
      status, text = send(ui, 'GET', path, {'Host': 'evil.example:%s' % host.split(':')[1]})
      assert status == 421, (path, status, text)
      assert 'ui_allowed_host' in text, text
    status, _ = send(ui, 'GET', '/api/jobs', {})
    assert status == 400
    status, _ = send(ui, 'GET', '/api/jobs', {'Host': host})
    assert status == 200

    # Actions: without the header, from another origin, or as a form post.
    cancel = '/api/jobs/%s/cancel' % job
    refusals = [
      {'Host': host},
      {'Host': host, 'Content-Type': 'text/plain'},
      {'Host': host, 'X-Refract-Action': '1', 'Origin': 'http://evil.example'},
      {'Host': host, 'X-Refract-Action': '1', 'Origin': 'null'},
      {
        'Host': host,
        'Content-Type': 'application/x-www-form-urlencoded',
        'Origin': 'http://evil.example',
      },
    ]
    for headers in refusals:
      status, text = send(ui, 'POST', cancel, headers, body=b'x')
      assert status == 403, (headers, status, text)
    assert job_state(ui, job) == 'RUNNING'

    # A hostile page in a real browser tries every way a page can.
    chromium = shutil.which('chromium') or shutil.which('chromium-browser')
    if not chromium:
      pytest.fail('chromium is not installed (integration/setup.sh installs it)', pytrace=False)
    url, page = serve_page(ATTACK_PAGE % {'ui': ui, 'job': job})
    done = subprocess.run(
      [
        chromium,
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-dev-shm-usage',
        '--virtual-time-budget=5000',
        '--dump-dom',
        url,
      ],
      capture_output=True,
      text=True,
      timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'done' in done.stdout, done.stdout[-2000:]
    assert 'header-blocked' in done.stdout, done.stdout[-2000:]
    assert 'read-blocked' in done.stdout, done.stdout[-2000:]
    time.sleep(1)
    assert job_state(ui, job) == 'RUNNING', server.log_tail()
    assert 'refused a web UI request' in server.log_tail(200000)

    # Savepoints go only into the savepoint directory, never over a file.
    outside = tmp_path / 'outside.sp'
    for target, expected in [(str(outside), 400), ('../escape.sp', 400), ('sub/x.sp', 400)]:
      status, text = send(
        ui,
        'POST',
        '/api/jobs/%s/savepoint' % job,
        {'Host': host, 'X-Refract-Action': '1'},
        body=target.encode(),
      )
      assert status == expected, (target, status, text)
      assert 'refused' in text, text
    assert not outside.exists()
    status, text = send(
      ui,
      'POST',
      '/api/jobs/%s/savepoint' % job,
      {'Host': host, 'X-Refract-Action': '1'},
      body=b'first.sp',
    )
    assert status == 200, text
    assert (savepoints / 'first.sp').is_file()
    status, text = send(
      ui,
      'POST',
      '/api/jobs/%s/savepoint' % job,
      {'Host': host, 'X-Refract-Action': '1'},
      body=b'first.sp',
    )
    assert status == 500 and 'already there' in text, (status, text)

    # Secrets: the option is redacted in GetJobs, and the password the
    # DoFn logs (and the SDK's own log of its options) is redacted in the
    # job's messages, the UI's logs and the server's log.
    options = json.dumps(dict(info.pipeline_options.fields.items()), default=str)
    assert SECRET not in str(info.pipeline_options), options
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
      status, text = send(ui, 'GET', '/api/jobs/%s/logs?q=password' % job, {'Host': host})
      entries = json.loads(text)['entries']
      if any('password=***' in e['text'] for e in entries):
        break
      time.sleep(0.5)
    assert any('password=***' in e['text'] for e in entries), entries[-5:]
    assert SECRET not in text
    assert SECRET not in server.log_tail(10_000_000)

    # The page itself still acts: with its header, from its own origin.
    status, text = send(
      ui, 'POST', cancel, {'Host': host, 'X-Refract-Action': '1', 'Origin': ui}, body=b''
    )
    assert status == 200, text
  finally:
    if page:
      page.shutdown()
    server.stop()


def test_a_savepoint_asked_while_workers_boot_waits_for_them(request, refract_bin, tmp_path):
  """The job is RUNNING as soon as it is submitted, while its workers still
  start: a savepoint asked then is taken once the engine runs."""
  savepoints = tmp_path / 'savepoints'
  slow_boot = tmp_path / 'slow_boot.sh'
  slow_boot.write_text('#!/bin/sh\nsleep 4\nexec %s "$@"\n' % BOOT)
  slow_boot.chmod(0o755)
  server, ui = ui_server(
    refract_bin, tmp_path / 'refract.log', extra_args=['--savepoint_dir', str(savepoints)]
  )
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    job, _ = start_endless_job(server, boot=str(slow_boot))
    host = ui[len('http://') :]
    status, text = send(
      ui,
      'POST',
      '/api/jobs/%s/savepoint' % job,
      {'Host': host, 'X-Refract-Action': '1'},
      body=b'early.sp',
    )
    assert status == 200, text
    assert (savepoints / 'early.sp').is_file()
    assert job_state(ui, job) == 'RUNNING'
    status, text = send(
      ui,
      'POST',
      '/api/jobs/%s/cancel' % job,
      {'Host': host, 'X-Refract-Action': '1', 'Origin': ui},
      body=b'',
    )
    assert status == 200, text
  finally:
    server.stop()
