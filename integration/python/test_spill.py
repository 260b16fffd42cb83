"""A batch GroupByKey larger than its share of `--memory_budget` spills to
disk and still completes with every value, exactly once, under its key.

The server gets a 16 MiB budget; the pipeline (gbk_spill_pipeline.py)
groups 200 MiB of incompressible 64 KiB values under 1 000 keys and
checks the totals in the pipeline itself. The runner says in the job's
messages how much it spilled; its spill directory is empty afterwards.
The same, smaller, with the default spill directory (a temporary one the
server creates and removes when it stops); and grouped in session
windows, which the runner finds only by merging each key's spilled
pieces; and in fixed windows and in sessions that allow lateness (which
stay open after their on-time pane); and with all values emitted by one element, whose output (which
cannot be split) waits on disk for its bundle to end — and then, once
committed, in the next stage's queue (through a Reshuffle; with
`--state_dir`, beside the checkpoints, which name it). A stateful
DoFn's bag state spills likewise, in batch and in streaming jobs (beside
the checkpoints, in jobs that take them). (Peak memory is measured by
integration/bench/gbk_spill_memory.py and stateful_memory.py, not asserted
here.)
"""

import pytest

from refract_testlib import finished_line, spilled_bytes


@pytest.mark.parametrize(
  'spill_dir_flag,total_mb,keys,fan_out,session_len,reshuffle,lateness_s,lateness_windows',
  [
    (True, 200, 1000, 0, 0, 0, 0, 'fixed'),
    (False, 96, 1000, 0, 0, 0, 0, 'fixed'),
    (True, 96, 100, 0, 4, 0, 0, 'fixed'),
    (True, 96, 100, 0, 4, 0, 3600, 'fixed'),
    (True, 96, 100, 0, 4, 0, 3600, 'sessions'),
    (True, 96, 100, 1, 0, 0, 0, 'fixed'),
    (True, 96, 100, 1, 0, 1, 0, 'fixed'),
  ],
  ids=[
    'spill_dir',
    'default_spill_dir',
    'sessions',
    'fixed_windows_allowing_lateness',
    'sessions_allowing_lateness',
    'one_element_fans_out',
    'one_element_fans_out_into_a_queue',
  ],
)
def test_a_groupbykey_larger_than_the_memory_budget_spills_and_completes(
  request,
  refract_bin,
  tmp_path,
  spill_dir_flag,
  total_mb,
  keys,
  fan_out,
  session_len,
  reshuffle,
  lateness_s,
  lateness_windows,
):
  spill_dir = tmp_path / 'spill'
  extra = ['--memory_budget', '16m', '--serve_http=false']
  if spill_dir_flag:
    extra += ['--spill_dir', str(spill_dir)]
  finished = finished_line(
    request,
    refract_bin,
    tmp_path,
    extra,
    'gbk_spill_pipeline.py',
    [total_mb, 64, keys, fan_out, session_len, reshuffle, lateness_s, lateness_windows],
  )
  assert spilled_bytes(finished, 'spilled_bytes') > 0, finished
  # One element's output (the fan-out's) cannot be split: past its
  # bundle's share it waits on disk until the bundle ends.
  if fan_out:
    output_spilled = spilled_bytes(finished, 'output_spilled_bytes')
    assert output_spilled > (total_mb << 20) // 2, finished
  # Committed at once, that output lands in the next stage's queue, far
  # past its bound: the queue keeps its back on disk.
  if reshuffle:
    queue_spilled = spilled_bytes(finished, 'queue_spilled_bytes')
    assert queue_spilled > (total_mb << 20) // 2, finished
  # Spilled bytes are deleted as windows are emitted (RocksDB's own files
  # stay, without the data).
  assert sum(f.stat().st_size for f in spill_dir.rglob('*.sst')) < 1 << 20


def test_an_overfull_queue_waits_beside_the_checkpoints_with_a_state_dir(
  request, refract_bin, tmp_path
):
  """The fan-out into a queue (as above) on a server with `--state_dir` and
  frequent checkpoints: the queue's back goes to the state database
  instead of the spill directory, checkpoints name it rather than wait
  for it to drain, and the job completes with every value once (the
  pipeline checks the totals)."""
  log_path = tmp_path / 'refract-serve.log'
  extra = [
    '--memory_budget',
    '16m',
    '--serve_http=false',
    '--spill_dir',
    str(tmp_path / 'spill'),
    '--state_dir',
    str(tmp_path / 'state'),
    '--checkpoint_interval',
    '100ms',
  ]
  finished = finished_line(
    request,
    refract_bin,
    tmp_path,
    extra,
    'gbk_spill_pipeline.py',
    [96, 64, 100, 1, 0, 1, 0, 'fixed'],
  )
  assert spilled_bytes(finished, 'queue_spilled_bytes') > (96 << 20) // 2, finished
  # Periodic checkpoints wait for the GroupByKey after the queue (on the
  # spill directory), said in the log; never for the queue.
  waits = [
    line for line in log_path.read_text().splitlines() if 'periodic checkpoints wait' in line
  ]
  assert waits, 'the GroupByKey spills: checkpoints wait for it'
  assert not [line for line in waits if 'its queue' in line], waits


@pytest.mark.parametrize(
  'mode,state_dir',
  [('batch', False), ('streaming', False), ('batch', True), ('streaming', True)],
  ids=['batch', 'streaming', 'batch_checkpointed', 'streaming_checkpointed'],
)
def test_user_state_larger_than_the_memory_budget_spills_and_completes(
  request, refract_bin, tmp_path, mode, state_dir
):
  """A stateful DoFn buffering 12 MiB in bag state until its end-of-window
  timers read it back (stateful_bag_pipeline.py) under a 4 MiB budget: the
  bags go to disk past the stage's share, every value comes back once (the
  pipeline checks the totals), and the runner says how much spilled. In
  batch and in streaming, and in jobs that checkpoint (`--state_dir`),
  whose bags go beside their checkpoints in the state database instead
  (test_recovery.py kills such a job's runner)."""
  extra = ['--memory_budget', '4m', '--serve_http=false', '--spill_dir', str(tmp_path / 'spill')]
  if state_dir:
    extra += ['--state_dir', str(tmp_path / 'state')]
  finished = finished_line(
    request, refract_bin, tmp_path, extra, 'stateful_bag_pipeline.py', [12, 1, 5000, mode]
  )
  assert spilled_bytes(finished, 'state_spilled_bytes') > 0, finished


def test_a_key_larger_than_memory_reaches_its_consumer_as_a_state_backed_iterable(
  request, refract_bin, tmp_path
):
  """One key holding 96 MiB under a 16 MiB budget: the GroupByKey spills
  it, and rather than read it back into one element, hands it to the
  consumer as a state-backed iterable (the consumer's input coder says it
  may), which the Python SDK pages through over the state API as the
  DoFn iterates. The pipeline checks the count and bytes of the key's
  values."""
  spill_dir = tmp_path / 'spill'
  extra = ['--memory_budget', '16m', '--serve_http=false', '--spill_dir', str(spill_dir)]
  finished = finished_line(
    request, refract_bin, tmp_path, extra, 'gbk_spill_pipeline.py', [96, 64, 1]
  )
  assert spilled_bytes(finished, 'handed_out_keys') == 1, finished
  assert sum(f.stat().st_size for f in spill_dir.rglob('*.sst')) < 1 << 20
