"""A bundle that stops making progress is found from the SDK's progress
reports: the web UI lists it with the transform it is busy in, the job's
messages say so, and with --fail_stalled_bundles its attempt fails and the
engine runs its input again, keeping exactly one copy of the output."""

import os
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to

from refract_browser import page_dom
from refract_testlib import get_json
from refract_testlib import job_messages
from refract_testlib import serving
from refract_testlib import ui_server


class StallOnce(beam.DoFn):
  """Sleeps `seconds` in the first bundle it sees (per marker file): no
  element leaves it meanwhile, as with a call that hangs."""

  def __init__(self, marker, seconds):
    self.marker = marker
    self.seconds = seconds

  def process(self, element):
    if not os.path.exists(self.marker):
      with open(self.marker, 'w') as f:
        f.write('stalled once')
      time.sleep(self.seconds)
    yield element * 10


def pipeline(options, marker, seconds):
  p = beam.Pipeline(options=options)
  out = p | 'Numbers' >> beam.Create([1, 2, 3]) | 'Stall' >> beam.ParDo(StallOnce(marker, seconds))
  assert_that(out, equal_to([10, 20, 30]))
  return p


def wait_for_stalled(ui, timeout_s=30):
  """The job whose bundle stalled, and the UI's list of its stalled
  bundles, once it has one."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    for job in get_json(ui + '/api/jobs'):
      stalled = get_json('%s/api/jobs/%s' % (ui, job['id']))['stalled_bundles']
      if stalled:
        return job['id'], stalled
    time.sleep(0.2)
  raise AssertionError('no bundle was listed as stalled within %ss' % timeout_s)


def test_a_stalled_bundle_is_listed_and_told_until_it_ends(request, refract_bin, tmp_path):
  server, ui = ui_server(
    refract_bin, tmp_path / 'refract-serve.log', extra_args=['--bundle_stall_timeout', '2s']
  )
  with serving(request, server):
    p = pipeline(PipelineOptions(server.portable_args()), str(tmp_path / 'marker'), seconds=14)
    result = p.run()
    job, stalled = wait_for_stalled(ui)
    assert len(stalled) == 1, stalled
    assert stalled[0]['transform'] == 'Stall', stalled
    assert 'Stall' in stalled[0]['stage'], stalled
    # Listed in the page, as a browser renders it.
    page = page_dom('%s/#%s' % (ui, job))
    section = page[page.index('id="stalled-section"') :][:6000]
    assert 'hidden' not in section.split('>')[0], section[:500]
    assert 'stalled-bundle' in section and '>Stall<' in section, section
    # Only told: the bundle ends by itself and the job succeeds.
    result.wait_until_finish()
    assert result.state == 'DONE', result.state
    assert get_json('%s/api/jobs/%s' % (ui, job))['stalled_bundles'] == []
    said = [m for m in job_messages(server.endpoint, job) if 'has made no progress' in m]
    assert len(said) == 1, said
    assert "busy in 'Stall'" in said[0], said
    assert 'failed' not in said[0], said


def test_with_fail_stalled_bundles_the_bundle_is_run_again(request, refract_bin, tmp_path):
  server, ui = ui_server(
    refract_bin,
    tmp_path / 'refract-serve.log',
    extra_args=['--bundle_stall_timeout', '2s', '--fail_stalled_bundles'],
  )
  with serving(request, server):
    started = time.monotonic()
    p = pipeline(PipelineOptions(server.portable_args()), str(tmp_path / 'marker'), seconds=20)
    result = p.run()
    result.wait_until_finish()
    # Done long before the stalled attempt would have ended by itself,
    # with every output once (assert_that).
    assert result.state == 'DONE', result.state
    assert time.monotonic() - started < 18, time.monotonic() - started
    job = get_json(ui + '/api/jobs')[0]['id']
    said = job_messages(server.endpoint, job)
    stalls = [m for m in said if 'has made no progress' in m]
    assert stalls and 'failed, to be retried' in stalls[0], said
    failed = get_json('%s/api/jobs/%s' % (ui, job))['failed_bundles']
    assert failed and failed[0]['count'] == 1, failed
