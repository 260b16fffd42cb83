"""One job on several engine shards (`--experiments=refract_shards=N`) with
the real Python SDK: the keyed work of each pipeline is split over three
engines by key group, elements cross between them, and every result is the
one a single engine gives. Each pipeline checks its own output with
`assert_that`, so a lost, duplicated or early-fired element fails it. The
shards exchange through the in-process board, and (`grpc`) through the
frame protocol over gRPC on the loopback interface, as between hosts.
"""

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, TimerSpec, on_timer
from refract_testlib import durable_server, finished_line, free_port, job_messages, spilled_bytes

SHARDS = '--experiments=refract_shards=3'
WORDS = ['w%02d' % (i % 40) for i in range(2000)]


EXCHANGES = pytest.mark.parametrize('exchange', ['board', 'grpc'])


def sharded(server, *extra, exchange='board'):
  return PipelineOptions(
    server.portable_args(SHARDS, '--experiments=refract_shard_exchange=' + exchange, *extra)
  )


def count_and_weigh_words(p, words_source=None):
  """Adds to `p` the word counts of WORDS three ways, each checked with
  `assert_that`: lifted CombinePerKey, Reshuffle and GroupByKey, and the
  counts weighed by an AsDict side input. `words_source` may stand
  between the words and the counting (a counting DoFn, say)."""
  counts = {}
  for w in WORDS:
    counts[w] = counts.get(w, 0) + 1
  words = p | 'Words' >> beam.Create(WORDS)
  if words_source is not None:
    words = words | 'Through' >> words_source
  weights = p | 'Weights' >> beam.Create([('w%02d' % i, i) for i in range(40)])
  pairs = words | 'Pair' >> beam.Map(lambda w: (w, 1))
  # Lifted: a partial combine before the shuffle, the rest after it.
  combined = pairs | 'Count' >> beam.CombinePerKey(sum)
  grouped = (
    pairs
    | 'Shuffle' >> beam.Reshuffle()
    | 'Group' >> beam.GroupByKey()
    | 'Size' >> beam.MapTuple(lambda w, ones: (w, len(list(ones))))
  )
  weighted = combined | 'Weigh' >> beam.Map(
    lambda kv, ws: (kv[0], kv[1] * ws[kv[0]]), beam.pvalue.AsDict(weights)
  )
  assert_that(combined, equal_to(list(counts.items())), label='Combined')
  assert_that(grouped, equal_to(list(counts.items())), label='Grouped')
  assert_that(
    weighted,
    equal_to([(w, n * int(w[1:])) for w, n in counts.items()]),
    label='Weighted',
  )


@EXCHANGES
def test_grouping_combining_and_side_inputs_match_one_engine(refract_server, exchange):
  p = beam.Pipeline(options=sharded(refract_server, exchange=exchange))
  count_and_weigh_words(p)
  result = p.run()
  assert result.wait_until_finish() == 'DONE'
  said = job_messages(refract_server.endpoint, result._job_id)  # pylint: disable=protected-access
  joined = {'board': 'joined in memory', 'grpc': 'exchanging over gRPC'}[exchange]
  assert any('running on 3 engine shards' in m and joined in m for m in said), said


class SumAtWindowEnd(beam.DoFn):
  """Keeps each key's values in a bag and emits their sum when the
  window's end timer fires: state and timers on the key's shard."""

  BAG = BagStateSpec('values', VarIntCoder())
  END = TimerSpec('end', TimeDomain.WATERMARK)

  def process(
    self,
    kv,
    w=beam.DoFn.WindowParam,
    bag=beam.DoFn.StateParam(BAG),
    end=beam.DoFn.TimerParam(END),
  ):
    bag.add(kv[1])
    end.set(w.max_timestamp())

  @on_timer(END)
  def emit(self, key=beam.DoFn.KeyParam, bag=beam.DoFn.StateParam(BAG)):
    yield key, sum(bag.read())
    bag.clear()


def sum_at_window_ends(p):
  """Adds to `p` per-key sums of 600 numbers in 100 s windows, kept in a
  bag and emitted by an event-time timer, checked with `assert_that`."""
  elements = [('k%d' % (i % 12), i) for i in range(600)]
  want = {}
  for k, i in elements:
    want[(k, i // 100)] = want.get((k, i // 100), 0) + i
  sums = (
    p
    | 'Numbers' >> beam.Create(elements)
    | 'Stamp' >> beam.Map(lambda kv: window.TimestampedValue(kv, kv[1]))
    | 'Window' >> beam.WindowInto(window.FixedWindows(100))
    | 'Sum' >> beam.ParDo(SumAtWindowEnd())
    | 'WithWindow'
    >> beam.Map(lambda kv, w=beam.DoFn.WindowParam: ((kv[0], int(w.start) // 100), kv[1]))
  )
  assert_that(sums, equal_to(list(want.items())), label='Sums')


@EXCHANGES
def test_state_and_timers_fire_once_per_key_and_window(refract_server, exchange):
  with beam.Pipeline(options=sharded(refract_server, exchange=exchange)) as p:
    sum_at_window_ends(p)


def count_sessions(p):
  """Adds to `p` per-key session counts: per key, bursts of events 1 s
  apart, bursts 100 s apart, so one session per burst, each merged on its
  key's shard; checked with `assert_that`."""
  events = [('u%d' % u, burst * 100 + i) for u in range(9) for burst in range(3) for i in range(5)]
  sessions = (
    p
    | 'SessionEvents' >> beam.Create(events)
    | 'StampSessionEvents' >> beam.Map(lambda kv: window.TimestampedValue((kv[0], 1), kv[1]))
    | 'Sessions' >> beam.WindowInto(window.Sessions(10))
    | 'CountSessions' >> beam.CombinePerKey(sum)
    | 'SessionSpans'
    >> beam.Map(lambda kv, w=beam.DoFn.WindowParam: (kv[0], int(w.start), int(w.end), kv[1]))
  )
  want = [('u%d' % u, b * 100, b * 100 + 14, 5) for u in range(9) for b in range(3)]
  assert_that(sessions, equal_to(want), label='SessionsChecked')


@EXCHANGES
def test_session_windows_merge_on_their_keys_shard(refract_server, exchange):
  with beam.Pipeline(options=sharded(refract_server, exchange=exchange)) as p:
    count_sessions(p)


def test_a_shard_count_out_of_range_is_refused_at_submission(refract_server):
  options = PipelineOptions(refract_server.portable_args('--experiments=refract_shards=0'))
  with pytest.raises(Exception, match='refract_shards=0'):
    with beam.Pipeline(options=options) as p:
      _ = p | beam.Create([1])


def test_a_checkpointing_server_checkpoints_shards_in_epochs(refract_bin, tmp_path):
  """On a server with --state_dir a sharded job is checkpointed (each
  checkpoint an epoch every shard cuts); asked for memory state, it is
  not. Both give the single engine's results."""
  server = durable_server(
    refract_bin, str(tmp_path / 'state'), free_port(), tmp_path / 'refract-serve.log'
  )
  try:
    for extra, exchange, said in [
      ((), 'board', 'each checkpoint an epoch every shard cuts'),
      ((), 'grpc', 'each checkpoint an epoch every shard cuts'),
      (('--experiments=refract_state_store=memory',), 'board', 'its state is not checkpointed'),
    ]:
      p = beam.Pipeline(options=sharded(server, *extra, exchange=exchange))
      sums = p | beam.Create([('a', 1), ('b', 2), ('a', 3)]) | beam.CombinePerKey(sum)
      assert_that(sums, equal_to([('a', 4), ('b', 2)]))
      result = p.run()
      assert result.wait_until_finish() == 'DONE'
      messages = job_messages(server.endpoint, result._job_id)  # pylint: disable=protected-access
      assert any(said in m for m in messages), messages
  finally:
    server.stop()


@EXCHANGES
def test_a_groupbykey_past_the_memory_budget_spills_on_every_shard(
  request, refract_bin, tmp_path, exchange
):
  """96 MiB grouped under 1 000 keys with a 16 MiB budget on three shards:
  each shard's buffers spill under a prefix of its own, the pipeline
  checks every value came back once, and the spill space is given back.
  Over gRPC, a shard whose output waits for the exchange's credit parks
  as one woken later (the credit wakes it), not as a stuck one."""
  spill_dir = tmp_path / 'spill'
  extra = ['--memory_budget', '16m', '--serve_http=false', '--spill_dir', str(spill_dir)]
  exchanging = '--experiments=refract_shard_exchange=' + exchange
  args = [96, 64, 1000, 0, 0, 0, 0, 'fixed', SHARDS, exchanging]
  finished = finished_line(request, refract_bin, tmp_path, extra, 'gbk_spill_pipeline.py', args)
  assert spilled_bytes(finished, 'spilled_bytes') > 0, finished
  assert sum(f.stat().st_size for f in spill_dir.rglob('*.sst')) < 1 << 20


def test_user_state_past_the_memory_budget_spills_on_every_shard(request, refract_bin, tmp_path):
  """A stateful DoFn's 12 MiB of bags under a 4 MiB budget, on three
  shards: each shard's bags spill, and every value comes back once."""
  extra = ['--memory_budget', '4m', '--serve_http=false', '--spill_dir', str(tmp_path / 'spill')]
  args = [12, 1, 5000, 'batch', SHARDS]
  finished = finished_line(request, refract_bin, tmp_path, extra, 'stateful_bag_pipeline.py', args)
  assert spilled_bytes(finished, 'state_spilled_bytes') > 0, finished
