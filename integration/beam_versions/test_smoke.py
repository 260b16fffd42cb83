"""What a Beam Python user does first, on the apache-beam version of the
virtualenv this runs in, with the refract-beam wheel installed there
(integration/beam_versions.sh makes one such virtualenv per version).

Run with `pytest --refract`: the TestPipelines below then run on Refract
through the wheel's pytest plugin, as a user's suite would.

* a word count through `--runner=refract_beam.RefractRunner`, compared
  with the DirectRunner's;
* `TestPipeline`s with assert_that (a map, a GroupByKey);
* a streaming job with keyed state and an event-time timer, over a
  TestStream;
* a cross-language transform expanded by this Beam's Python expansion
  service and run by its worker pool.

`REFRACT_ROOT` names the repository (for the word count's input and the
expansion service's script).
"""

import glob
import os
import socket
import subprocess
import sys
import time

import pytest

import apache_beam as beam
from apache_beam.coders import coders
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms import window
from apache_beam.transforms.external import ImplicitSchemaPayloadBuilder

ROOT = os.environ['REFRACT_ROOT']
WORDS = os.path.join(ROOT, 'integration', 'wordcount', 'input.txt')
EXPANSION_SERVICE = os.path.join(ROOT, 'integration', 'python', 'python_expansion_service.py')


def test_runs_on_refract():
  """`pytest --refract` moved TestPipelines onto Refract."""
  assert type(TestPipeline().runner).__name__ == 'RefractRunner'


def counts(prefix):
  lines = []
  for name in glob.glob(prefix + '*'):
    with open(name) as f:
      lines.extend(f.read().splitlines())
  return sorted(lines)


def test_wordcount_matches_the_direct_runner(tmp_path):
  outputs = {}
  for runner in ('refract_beam.RefractRunner', 'DirectRunner'):
    prefix = str(tmp_path / runner / 'counts')
    done = subprocess.run(
      [
        sys.executable,
        '-m',
        'apache_beam.examples.wordcount',
        '--runner=' + runner,
        '--input',
        WORDS,
        '--output',
        prefix,
      ],
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    if runner.startswith('refract'):
      # In the supported range: no version warning, no refusal.
      assert 'tested with' not in done.stderr, done.stderr[-3000:]
    outputs[runner] = counts(prefix)
  assert outputs['refract_beam.RefractRunner'] == outputs['DirectRunner']
  assert len(outputs['DirectRunner']) > 100


def test_map_and_group_by_key():
  with TestPipeline() as p:
    grouped = (
      p
      | beam.Create(['a', 'bb', 'cc', 'ddd'])
      | beam.Map(lambda w: (len(w), w))
      | beam.GroupByKey()
      | beam.MapTuple(lambda n, ws: (n, sorted(ws)))
    )
    assert_that(grouped, equal_to([(1, ['a']), (2, ['bb', 'cc']), (3, ['ddd'])]))


class SumPerWindow(beam.DoFn):
  """Adds up each key's values in state; emits the sum when the
  watermark passes the end of the window."""

  TOTAL = userstate.ReadModifyWriteStateSpec('total', coders.VarIntCoder())
  FLUSH = userstate.TimerSpec('flush', userstate.TimeDomain.WATERMARK)

  def process(
    self,
    element,
    w=beam.DoFn.WindowParam,
    total=beam.DoFn.StateParam(TOTAL),
    flush=beam.DoFn.TimerParam(FLUSH),
  ):
    total.write((total.read() or 0) + element[1])
    flush.set(w.max_timestamp())

  @userstate.on_timer(FLUSH)
  def on_flush(self, key=beam.DoFn.KeyParam, total=beam.DoFn.StateParam(TOTAL)):
    yield key, total.read()
    total.clear()


def test_streaming_state_and_timers():
  events = (
    TestStream()
    .add_elements(
      [
        window.TimestampedValue(('a', 1), 1),
        window.TimestampedValue(('b', 10), 2),
        window.TimestampedValue(('a', 2), 3),
      ]
    )
    .advance_watermark_to(10)
    .add_elements(
      [
        window.TimestampedValue(('a', 5), 12),
      ]
    )
    .advance_watermark_to_infinity()
  )
  # Options added to the test pipeline's own: a TestPipeline given
  # `options=` would not take the runner of --test-pipeline-options or of
  # `pytest --refract`.
  with TestPipeline(additional_pipeline_args=['--streaming']) as p:
    assert type(p.runner).__name__ == 'RefractRunner'
    sums = p | events | beam.WindowInto(window.FixedWindows(10)) | beam.ParDo(SumPerWindow())
    assert_that(sums, equal_to([('a', 3), ('b', 10), ('a', 5)]))


@pytest.fixture(scope='module')
def expansion_service(tmp_path_factory):
  """This Beam's Python expansion service, with its worker pool."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  log = open(tmp_path_factory.mktemp('xlang') / 'service.log', 'w')
  proc = subprocess.Popen(
    [sys.executable, EXPANSION_SERVICE, str(port)], stdout=log, stderr=subprocess.STDOUT
  )
  deadline = time.time() + 60
  while True:
    try:
      socket.create_connection(('127.0.0.1', port), timeout=1).close()
      break
    except OSError:
      assert proc.poll() is None, 'the expansion service exited'
      assert time.time() < deadline, 'the expansion service did not listen'
      time.sleep(0.2)
  yield 'localhost:%d' % port
  proc.terminate()
  proc.wait(timeout=30)
  log.close()


def test_cross_language_transform(expansion_service):
  with TestPipeline() as p:
    prefixed = (
      p
      | beam.Create(['a', 'b']).with_output_types(str)
      | beam.ExternalTransform(
        'beam:transforms:xlang:test:prefix',
        ImplicitSchemaPayloadBuilder({'data': '0'}),
        expansion_service,
      )
    )
    assert_that(prefixed, equal_to(['0a', '0b']))
