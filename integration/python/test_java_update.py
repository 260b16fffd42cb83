"""Dataflow's `--update`, from a Java pipeline (integration/java's
UpdateCounts, the Java twin of recovery_pipeline.py): the next version of a
running streaming job (a step added, the sink fused apart and written by
another class, the stateful DoFn renamed) replaces it by `--jobName`,
carrying its state, timers and waiting elements. Java names a ParDo's
primitive after its composite (`DedupCount/ParMultiDo(DedupCount)`), so the
mapping names the composite, as a Dataflow user writes it, and renames what
is nested in it. An update that would lose the stateful DoFn's state is
refused at submission and the running job runs on; results and the carried
counter are exact.
"""

import re
import time

import pytest

from refract_testlib import committed_counter
from refract_testlib import job_state
from refract_testlib import refract_cli
from refract_testlib import submit_java
from refract_testlib import ui_server
from refract_testlib import wait_for_end

# The same model as the Python pipeline's: one result per (second, n % 3).
from test_recovery import expected_results
from test_recovery import read_results

# The first run may build integration/java with an empty Maven cache.
pytestmark = pytest.mark.timeout(600)

PIPELINE_MAIN = 'org.refract.examples.UpdateCounts'
# About forty seconds of input at the source's pace: long enough that the
# update lands mid-stream.
EVENTS = 3000


def submitted_job(printed):
  """The job id PortableRunner logged on submission."""
  assert 'submitted' in printed, printed[-4000:]
  ids = re.findall(r'RunJobResponse: job_id: "([^"]+)"', printed)
  assert ids, printed[-4000:]
  return ids[-1]


def wait_for_first_result(output, timeout_s=90):
  deadline = time.monotonic() + timeout_s
  while not read_results(output):
    assert time.monotonic() < deadline, 'no result within %ss' % timeout_s
    time.sleep(0.2)


def test_a_java_job_is_updated_mid_stream(
  request, refract_bin, tmp_path, java_classpath, worker_pool
):
  output = tmp_path / 'out'
  output.mkdir()
  server, _ = ui_server(refract_bin, tmp_path / 'refract.log')
  server.wait_ready()
  request.node.refract_processes = [server]
  pool, _ = worker_pool
  changed = ['--changed', '--statefulName=Counted', '--update']

  def java(name, *args):
    return submit_java(
      java_classpath,
      PIPELINE_MAIN,
      server.endpoint,
      pool,
      tmp_path / name,
      '--output=%s' % output,
      '--events=%d' % EVENTS,
      '--jobName=counts',
      *args,
    )

  try:
    code, printed = java('first.log')
    assert code == 0, printed[-4000:]
    old = submitted_job(printed)
    wait_for_first_result(output)

    code, printed = java('unmapped.log', *changed)
    assert code != 0, printed[-4000:]
    assert 'refused, and it runs on' in printed, printed[-4000:]
    assert "'DedupCount/ParMultiDo(DedupCount)'" in printed, printed[-4000:]
    assert job_state(server.endpoint, old) == 'RUNNING'

    code, printed = java('update.log', *changed, '--transformNameMapping={"DedupCount":"Counted"}')
    assert code == 0, printed[-4000:]
    new = submitted_job(printed)
    assert wait_for_end(server, old) == 'UPDATED', server.log_tail()
    assert read_results(output) != expected_results(EVENTS), (
      'the old job ended before the update; nothing was carried'
    )
    assert wait_for_end(server, new) == 'DONE', server.log_tail()
    # The counter went on from the old job's, under the transform's new name.
    assert committed_counter(server.endpoint, new, 'distinct_events') == EVENTS
    listed = refract_cli(refract_bin, server, 'jobs').stdout
    assert '%s\tUPDATED\tcounts\treplaced by %s' % (old, new) in listed, listed
  finally:
    server.stop()
  assert read_results(output) == expected_results(EVENTS)
