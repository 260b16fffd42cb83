"""A batch GroupByKey of a given size, for the spill test and benchmark.

A splittable source (one restriction of N record indices, split only by
the runner) emits N values of VALUE_BYTES bytes under KEYS keys; a
GroupByKey groups them; each group is reduced to (1 key, its count, its
bytes) and the totals are checked in the pipeline: every value arrived,
exactly once, under its key.

With FAN_OUT_INPUTS > 0 the same values come instead from that many
elements, reshuffled, each emitting its share from a plain DoFn (not
splittable): a bundle whose output is far bigger than its input, which
the runner can only split at an element.

With SESSION_LEN > 0 the values are grouped in session windows instead of
the global window: a key's values are one second apart in event time, with
a 100-second pause after every SESSION_LEN of them, and the sessions have
a 10-second gap; so each key has sessions of SESSION_LEN values (the last
one maybe fewer), which the runner only finds by merging each key's
windows. The totals are then per session.

With LATENESS_S > 0 too, the same groups are made by fixed windows (each
SESSION_LEN + 100 seconds long, so a window holds one of a key's runs of
SESSION_LEN values) that allow LATENESS_S seconds of lateness and fire late
panes for late data (none comes in a batch): windows that stay open after
their on-time pane. With LATENESS_WINDOWS = sessions, the same sessions as
above, allowing that lateness and firing late panes likewise.

With RESHUFFLE = 1 the values are reshuffled (and passed through a Map)
before they are grouped: they then wait in a queue for the Map's stage,
not in the GroupByKey's buffer.

    python gbk_spill_pipeline.py ENDPOINT TOTAL_MB [VALUE_KB] [KEYS] \
        [FAN_OUT_INPUTS] [SESSION_LEN] [RESHUFFLE] [LATENESS_S] \
        [LATENESS_WINDOWS]

prints the job id, waits for the job and exits 0 when it is DONE.
"""

import os
import sys
import typing

import apache_beam as beam
from apache_beam import window
from apache_beam.transforms import trigger
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
from refract_testlib import run_pipeline_to_end
from splittable_sources import Offsets

# Random bytes, sliced at different offsets: values that do not compress.
BLOCK = os.urandom(1 << 20)


# (Declared: with timestamps, what the DoFns yield is not inferred as KVs.)
KV = typing.Tuple[bytes, bytes]
SESSION_GAP_S = 10
SESSION_PAUSE_S = 100


def record(i, value_bytes, keys, session_len=0):
  """Record i: (key, value), at its event time when grouped in sessions."""
  at = (i * 7919) % (len(BLOCK) - value_bytes)
  kv = b'key-%08d' % (i % keys), BLOCK[at : at + value_bytes]
  if session_len <= 0:
    return kv
  j = i // keys  # the record's place among its key's records
  return window.TimestampedValue(kv, j + (j // session_len) * SESSION_PAUSE_S)


class Generate(beam.DoFn):
  def __init__(self, value_bytes, keys, session_len=0):
    self._value_bytes = value_bytes
    self._keys = keys
    self._session_len = session_len

  def process(self, n, tracker=beam.DoFn.RestrictionParam(Offsets())):
    i = tracker.current_restriction().start
    while tracker.try_claim(i):
      yield record(i, self._value_bytes, self._keys, self._session_len)
      i += 1


class FanOut(beam.DoFn):
  """Input `part` of `parts` emits its share of the records."""

  def __init__(self, records, parts, value_bytes, keys, session_len=0):
    self._records = records
    self._parts = parts
    self._value_bytes = value_bytes
    self._keys = keys
    self._session_len = session_len

  def process(self, part):
    first = part * self._records // self._parts
    end = (part + 1) * self._records // self._parts
    for i in range(first, end):
      yield record(i, self._value_bytes, self._keys, self._session_len)


def summarize(kv):
  _, values = kv
  count = 0
  size = 0
  for v in values:
    count += 1
    size += len(v)
  return (1, count, count, count, size)


def add(rows):
  keys, low, high, count, size = 0, None, None, 0, 0
  for k, lo, hi, c, s in rows:
    keys += k
    low = lo if low is None else min(low, lo)
    high = hi if high is None else max(high, hi)
    count += c
    size += s
  return (keys, low, high, count, size)


def expected(records, value_bytes, keys, session_len=0):
  """(groups, fewest and most values in a group, values, bytes)."""
  sizes = []
  for k in range(keys):
    n = records // keys + (1 if k < records % keys else 0)
    if session_len <= 0:
      sizes.append(n)
    else:
      sizes.extend([session_len] * (n // session_len))
      if n % session_len:
        sizes.append(n % session_len)
  return (len(sizes), min(sizes), max(sizes), records, records * value_bytes)


def build(
  p,
  records,
  value_bytes,
  keys,
  fan_out_inputs=0,
  session_len=0,
  reshuffle=False,
  lateness_s=0,
  lateness_windows='fixed',
):
  if fan_out_inputs > 0:
    values = (
      p
      | beam.Create(list(range(fan_out_inputs)))
      | beam.Reshuffle()
      | beam.ParDo(
        FanOut(records, fan_out_inputs, value_bytes, keys, session_len)
      ).with_output_types(KV)
    )
  else:
    values = (
      p
      | beam.Create([records])
      | beam.ParDo(Generate(value_bytes, keys, session_len)).with_output_types(KV)
    )
  if reshuffle:
    values = (
      values | 'Again' >> beam.Reshuffle() | 'Pass' >> beam.Map(lambda kv: kv).with_output_types(KV)
    )
  if session_len > 0 and lateness_s > 0 and lateness_windows == 'sessions':
    values = values | 'Sessions' >> beam.WindowInto(
      window.Sessions(SESSION_GAP_S),
      trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
      accumulation_mode=trigger.AccumulationMode.DISCARDING,
      allowed_lateness=lateness_s,
    )
  elif session_len > 0 and lateness_s > 0:
    values = values | 'Fixed' >> beam.WindowInto(
      window.FixedWindows(session_len + SESSION_PAUSE_S),
      trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
      accumulation_mode=trigger.AccumulationMode.DISCARDING,
      allowed_lateness=lateness_s,
    )
  elif session_len > 0:
    values = values | 'Sessions' >> beam.WindowInto(window.Sessions(SESSION_GAP_S))
  groups = values | beam.GroupByKey() | beam.Map(summarize)
  if session_len > 0:
    groups = groups | 'Global' >> beam.WindowInto(window.GlobalWindows())
  totals = groups | beam.CombineGlobally(add)
  assert_that(totals, equal_to([expected(records, value_bytes, keys, session_len)]))


def main(argv):
  # Arguments starting with -- are pipeline options (an experiment, say).
  flags = [a for a in argv[1:] if a.startswith('--')]
  argv = [a for a in argv if not a.startswith('--')]
  endpoint, total_mb = argv[1], int(argv[2])
  value_kb = int(argv[3]) if len(argv) > 3 else 100
  keys = int(argv[4]) if len(argv) > 4 else 5000
  fan_out_inputs = int(argv[5]) if len(argv) > 5 else 0
  session_len = int(argv[6]) if len(argv) > 6 else 0
  reshuffle = len(argv) > 7 and argv[7] == '1'
  lateness_s = int(argv[8]) if len(argv) > 8 else 0
  lateness_windows = argv[9] if len(argv) > 9 else 'fixed'
  if lateness_windows not in ('fixed', 'sessions'):
    raise SystemExit('LATENESS_WINDOWS is fixed or sessions, not %r' % lateness_windows)
  value_bytes = value_kb * 1024
  records = total_mb * (1 << 20) // value_bytes
  keys = min(keys, records)
  options = PipelineOptions(
    ['--runner=PortableRunner', '--job_endpoint=' + endpoint, '--environment_type=LOOPBACK'] + flags
  )
  p = beam.Pipeline(options=options)
  build(
    p,
    records,
    value_bytes,
    keys,
    fan_out_inputs,
    session_len,
    reshuffle,
    lateness_s,
    lateness_windows,
  )
  return run_pipeline_to_end(p)


if __name__ == '__main__':
  sys.exit(main(sys.argv))
