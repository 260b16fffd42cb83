"""Runner-initiated splits of running bundles.

A bundle of a splittable DoFn that runs for more than a quarter second is
asked to split at half of its remaining work, and every second after that
to keep 1% of what is left, where what it gives back can run beside it
(another worker, or another bundle waiting for this one's) and always in a
streaming job (a bundle's output reaches its consumers only when it
commits); the SDK keeps the primary and hands back the residual
restriction, which Refract starts as a bundle of its own at once. Every
offset is still produced exactly once. A lone Python worker in a batch job
is not split for time: the split would only cost it work.

Any other bundle that reads data is split the same way, at an element,
once its output passes its share of the memory budget (a DoFn that emits
far more than it reads) and when a worker idles while it runs (a few slow
elements make one bundle): it gives back the elements it has not reached,
which run as bundles of their own. Every element's output still arrives
exactly once. A stateful stage's bundle gets its elements grouped by key
group and is split only between groups; the groups it gives back are free
for another worker at once, and each key's state still sees each of its
elements once.
"""

import time

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import CombiningValueStateSpec
from apache_beam.transforms.userstate import TimerSpec
from apache_beam.transforms.userstate import on_timer

from refract_testlib import RefractServer
from splittable_sources import Offsets

COUNT = 30


def run_and_count_bundles(p):
  """Runs `p` to the end: the 'bundles' counters its DoFns' start_bundle
  count."""
  result = p.run()
  result.wait_until_finish()
  return result.metrics().query(beam.metrics.MetricsFilter().with_name('bundles'))['counters']


def assert_split(bundles):
  """What one bundle would have done took more than one."""
  assert sum(c.committed for c in bundles) >= 2, bundles


class SlowRange(beam.DoFn):
  def start_bundle(self):
    Metrics.counter('splits', 'bundles').inc()

  def process(self, element, tracker=beam.DoFn.RestrictionParam(Offsets())):
    position = tracker.current_restriction().start
    while tracker.try_claim(position):
      time.sleep(0.1)
      yield position
      position += 1


def slow_range_bundles(server, *args):
  p = beam.Pipeline(options=PipelineOptions(server.portable_args(*args)))
  out = p | beam.Create([COUNT]) | beam.ParDo(SlowRange())
  assert_that(out, equal_to(list(range(COUNT))))
  return run_and_count_bundles(p)


def test_a_long_bundle_is_split_and_nothing_is_lost_or_repeated(refract_server):
  assert_split(slow_range_bundles(refract_server, '--sdk_worker_parallelism=2'))


def test_a_long_bundle_of_a_streaming_job_is_split_on_one_worker(refract_server):
  assert_split(slow_range_bundles(refract_server, '--streaming'))


def test_a_long_bundle_is_not_split_when_nothing_could_run_beside_it(refract_server):
  # One worker, which runs one bundle at a time, and nothing else to do.
  bundles = slow_range_bundles(refract_server)
  assert sum(c.committed for c in bundles) == 1, bundles


INPUTS = 40
FAN_OUT = 500


class FanOut(beam.DoFn):
  """Emits FAN_OUT 1 KiB values per input: 500 KiB for each element read.

  The SDK sends a bundle's output in 10 MB flushes, so the runner sees the
  bundle's output only 20 elements in; the pause per element keeps the
  bundle running well past that (the runner looks every 20 ms).
  """

  def start_bundle(self):
    Metrics.counter('fan_out', 'bundles').inc()

  def process(self, element):
    time.sleep(0.02)
    for j in range(FAN_OUT):
      yield element, b'%06d' % j + b'x' * 1018


def test_a_bundle_whose_output_outgrows_its_share_is_split_at_an_element(
  request, refract_bin, tmp_path
):
  # A 16 MiB budget gives each bundle of a stage 1 MiB of output; the one
  # bundle the 40 reshuffled elements would make emits 20 MiB.
  server = RefractServer(
    refract_bin,
    tmp_path / 'refract-serve.log',
    extra_args=['--memory_budget', '16m', '--serve_http=false'],
  )
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    p = beam.Pipeline(options=PipelineOptions(server.portable_args()))
    sizes = (
      p
      | beam.Create(list(range(INPUTS)))
      | beam.Reshuffle()
      | beam.ParDo(FanOut())
      # A GroupByKey the SDK cannot pre-combine: every value the fan-out
      # emits comes back to the runner in its bundle's output.
      | beam.GroupByKey()
      | beam.MapTuple(lambda k, vs: (k, sorted(v[:6] for v in vs)))
    )
    assert_that(
      sizes, equal_to([(i, [b'%06d' % j for j in range(FAN_OUT)]) for i in range(INPUTS)])
    )
    bundles = run_and_count_bundles(p)
  finally:
    server.stop()
  # Without splits the 40 elements are one bundle.
  assert_split(bundles)


SLOW_ELEMENTS = 12


class Slow(beam.DoFn):
  """0.2 s per element: a bundle of all of them would take 2.4 s."""

  def start_bundle(self):
    Metrics.counter('slow', 'bundles').inc()

  def process(self, element):
    time.sleep(0.2)
    yield element


def test_a_bundle_of_slow_elements_is_shared_with_an_idle_worker(refract_server):
  # Two workers; the twelve reshuffled elements make one bundle (bundles
  # are cut no smaller than 1 000 elements), which one worker would run
  # alone while the other idles.
  p = beam.Pipeline(
    options=PipelineOptions(refract_server.portable_args('--sdk_worker_parallelism=2'))
  )
  out = p | beam.Create(list(range(SLOW_ELEMENTS))) | beam.Reshuffle() | beam.ParDo(Slow())
  assert_that(out, equal_to(list(range(SLOW_ELEMENTS))))
  assert_split(run_and_count_bundles(p))


STATEFUL_KEYS = 16


class SlowCount(beam.DoFn):
  """0.1 s per element; counts each key's elements in state and emits
  (key, how many of its elements it has seen)."""

  SEEN = CombiningValueStateSpec('seen', sum)

  def start_bundle(self):
    Metrics.counter('slow', 'bundles').inc()

  def process(self, kv, seen=beam.DoFn.StateParam(SEEN)):
    time.sleep(0.1)
    seen.add(1)
    yield kv[0], seen.read()


def test_slow_stateful_bundles_shared_with_idle_workers_keep_each_keys_state(refract_server):
  # Two workers; a key's three elements may land in a bundle another
  # worker's bundle took groups from: each still counts 1, 2, 3.
  p = beam.Pipeline(
    options=PipelineOptions(refract_server.portable_args('--sdk_worker_parallelism=2'))
  )
  out = (
    p
    | beam.Create([(k, i) for i in range(3) for k in range(STATEFUL_KEYS)])
    | beam.Reshuffle()
    | beam.ParDo(SlowCount())
  )
  assert_that(out, equal_to([(k, n) for k in range(STATEFUL_KEYS) for n in (1, 2, 3)]))
  run_and_count_bundles(p)


class SlowCountThenReport(beam.DoFn):
  """SlowCount with an event-time timer per key: once every element is in
  (batch), it reports (key, 'total', how many its state counted)."""

  SEEN = CombiningValueStateSpec('seen', sum)
  REPORT = TimerSpec('report', TimeDomain.WATERMARK)

  def process(self, kv, seen=beam.DoFn.StateParam(SEEN), report=beam.DoFn.TimerParam(REPORT)):
    time.sleep(0.1)
    seen.add(1)
    report.set(100)
    yield kv[0], seen.read()

  @on_timer(REPORT)
  def on_report(self, key=beam.DoFn.KeyParam, seen=beam.DoFn.StateParam(SEEN)):
    yield key, 'total', seen.read()


def test_slow_bundles_of_a_stage_with_timers_are_split_for_idle_workers(
  request, refract_bin, tmp_path
):
  # As above, with a timer per key: a bundle of a stage with timers is
  # split between key groups too (the runner logs each split that let
  # groups go at debug level), and each key's timer fires once, after all
  # three of its elements.
  server = RefractServer(
    refract_bin,
    tmp_path / 'refract-serve.log',
    extra_args=['--log_level', 'debug', '--serve_http=false'],
  )
  request.node.refract_processes = [server]
  try:
    server.wait_ready()
    p = beam.Pipeline(options=PipelineOptions(server.portable_args('--sdk_worker_parallelism=2')))
    out = (
      p
      | beam.Create([(k, i) for i in range(3) for k in range(STATEFUL_KEYS)])
      | beam.Reshuffle()
      | beam.ParDo(SlowCountThenReport())
    )
    assert_that(
      out,
      equal_to(
        [(k, n) for k in range(STATEFUL_KEYS) for n in (1, 2, 3)]
        + [(k, 'total', 3) for k in range(STATEFUL_KEYS)]
      ),
    )
    p.run().wait_until_finish()
  finally:
    server.stop()
  with open(server.log_path, encoding='utf-8', errors='replace') as f:
    log = f.read()
  assert 'split bundle let key groups go' in log, server.log_tail()
