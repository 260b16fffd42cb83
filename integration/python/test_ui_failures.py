"""What went wrong, at a glance, in a real browser (headless Chromium): a
job whose DoFn fails shows a banner with the SDK's error, its failed
bundles grouped by the transform that threw, and a graph of the user's
transforms by the names the pipeline gave them, with composites that open
from the page's address. Screenshots are kept as test artifacts."""

import subprocess

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from refract_browser import page_dom
from refract_browser import screenshot
from refract_testlib import get_json
from refract_testlib import ui_server

BAD_RECORD = 'refract-ui: cannot decode record'


def decode(line):
  if not line.isdigit():
    raise ValueError('%s %r' % (BAD_RECORD, line))
  return int(line)


class Parse(beam.PTransform):
  """A composite of two steps, the first of which fails on one record."""

  def expand(self, lines):
    return lines | 'Decode' >> beam.Map(decode) | 'KeepEven' >> beam.Filter(lambda n: n % 2 == 0)


def test_failed_job_shows_error_failing_transform_and_user_graph(request, refract_bin, tmp_path):
  server, ui = ui_server(refract_bin, tmp_path / 'refract-serve.log')
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    p = beam.Pipeline(options=PipelineOptions(server.portable_args()))
    _ = (
      p
      | 'Lines' >> beam.Create(['1', '2', 'x', '4'])
      | 'Parse' >> Parse()
      | 'CountAll' >> beam.combiners.Count.Globally()
    )
    result = p.run()
    try:
      result.wait_until_finish()
    except Exception as e:  # pylint: disable=broad-except
      assert BAD_RECORD in str(e), e
    job = get_json(ui + '/api/jobs')[0]['id']
    details = get_json('%s/api/jobs/%s' % (ui, job))
    assert details['state'] == 'FAILED', details['state']
    assert BAD_RECORD in details['failure'], details['failure']

    # Every failed attempt, grouped under the transform that threw.
    groups = details['failed_bundles']
    assert [g['transform'] for g in groups] == ['Parse/Decode'], groups
    assert groups[0]['count'] >= 1, groups
    assert 'Traceback' in groups[0]['last_error'], groups[0]['last_error']

    # The graph names the user's transforms; the composite opens.
    graph = get_json('%s/api/jobs/%s/graph' % (ui, job))
    names = {t['name'] for t in graph['transforms']}
    assert {'Lines', 'Parse', 'Parse/Decode', 'Parse/KeepEven', 'CountAll'} <= names, names
    parse = next(t for t in graph['transforms'] if t['name'] == 'Parse')
    assert len(parse['children']) == 2 and parse['stages'], parse

    page = page_dom('%s/#%s' % (ui, job))
    banner = page[page.index('id="failure"') :][:4000]
    assert 'hidden' not in banner.split('>')[0], banner
    assert 'This job failed' in banner and BAD_RECORD in banner, banner
    failures = page[page.index('id="failures-section"') :][:20000]
    assert 'hidden' not in failures.split('>')[0], failures[:500]
    assert 'Parse/Decode' in failures and 'Traceback' in failures, failures
    # Closed, the composite is one box, marked as where the failure is.
    assert '<span class="label">Parse</span>' in page, page[-4000:]
    assert 'class="node composite failed"' in page, page[-4000:]
    assert '<span class="label">Decode</span>' not in page
    assert 'ref_PCollection' not in page.split('id="pipeline"')[1].split('</div></div>')[0]
    screenshot('%s/#%s' % (ui, job), 'failed-job')

    # Opened through the address, it shows its parts instead.
    opened_url = '%s/#%s;open=Parse' % (ui, job)
    opened = page_dom(opened_url)
    assert '<span class="label">Decode</span>' in opened, opened[-4000:]
    assert '<span class="label">KeepEven</span>' in opened, opened[-4000:]
    assert '▾ Parse' in opened, opened[-4000:]
    screenshot(opened_url, 'failed-job-composite-open')

    # The CLI says why too.
    status = subprocess.run(
      [refract_bin, 'status', job, '--job_endpoint', server.endpoint],
      capture_output=True,
      text=True,
      timeout=30,
    )
    assert status.returncode == 0, status.stderr
    assert 'FAILED' in status.stdout and BAD_RECORD in status.stdout, status.stdout
  finally:
    server.stop()
