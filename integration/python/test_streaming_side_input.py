"""Slowly updating side inputs (a stream-table join) on Refract.

Beam's pattern for Python: a PeriodicImpulse produces a new side-input value
every interval, windowed into fixed windows (`apply_windowing=True`), and a
main stream in the same windows reads it as a singleton. Each main element
must see the side value of its own window, which arrives while the job runs:
Refract holds a main element until the side input's watermark has passed the
element's window, then serves that window's value.

(A globally windowed side input would be read once per worker by the Python
harness, which evaluates side inputs of globally windowed DoFns when it
builds them, so the windowed form is the one that updates.)
"""

import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.periodicsequence import PeriodicImpulse


def record(path):
  def append(pair):
    with open(path, 'a') as f:
      f.write('%d %d\n' % pair)

  return append


def test_each_main_element_sees_the_side_value_of_its_window(refract_server, tmp_path):
  out = str(tmp_path / 'pairs.txt')
  start = int(time.time()) + 1
  ticks = dict(
    start_timestamp=start, stop_timestamp=start + 6, fire_interval=1, apply_windowing=True
  )
  options = PipelineOptions(refract_server.portable_args() + ['--streaming'])
  with beam.Pipeline(options=options) as p:
    side = p | 'SideTicks' >> PeriodicImpulse(**ticks) | 'SideValue' >> beam.Map(lambda t: int(t))
    _ = (
      p
      | 'MainTicks' >> PeriodicImpulse(**ticks)
      | 'Join' >> beam.Map(lambda t, s: (int(t), s), beam.pvalue.AsSingleton(side))
      | 'Record' >> beam.Map(record(out))
    )
  with open(out) as f:
    pairs = [tuple(int(v) for v in line.split()) for line in f]
  assert len(pairs) >= 5, pairs
  assert all(t == s for t, s in pairs), pairs
