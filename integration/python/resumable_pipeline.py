"""The pipeline of the failed-job test (test_failed_jobs.py), run as a
script so that its functions travel to PROCESS workers by value.

A batch job: the numbers 0..N-1, keyed by i % 3, counted and summed per key
in user state (no deduplication: a number applied twice would show), with
a counter of the numbers applied. While the file --poison exists, applying
the number --poison_at fails, so the job fails once its retries run out —
after other bundles committed and were checkpointed. Resumed once the file
is gone, it must finish with every number applied exactly once. At the end
of the window each key's totals are written to `KEY.json`.

    python resumable_pipeline.py --job_endpoint HOST:PORT --output DIR
        --numbers N --poison FILE --poison_at K --boot PATH/python_boot.sh

prints the job id and exits without waiting for the job.
"""

import argparse
import json
import os

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import userstate


class Count(beam.DoFn):
  APPLIED = Metrics.counter('resumable', 'applied')
  COUNT = userstate.ReadModifyWriteStateSpec('count', VarIntCoder())
  TOTAL = userstate.ReadModifyWriteStateSpec('total', VarIntCoder())
  END = userstate.TimerSpec('end', userstate.TimeDomain.WATERMARK)

  def __init__(self, poison, poison_at):
    self.poison = poison
    self.poison_at = poison_at

  def process(
    self,
    kv,
    w=beam.DoFn.WindowParam,
    count=beam.DoFn.StateParam(COUNT),
    total=beam.DoFn.StateParam(TOTAL),
    end=beam.DoFn.TimerParam(END),
  ):
    _, number = kv
    if number == self.poison_at and os.path.exists(self.poison):
      raise RuntimeError('poisoned at %d while %s exists' % (number, self.poison))
    self.APPLIED.inc()
    count.write((count.read() or 0) + 1)
    total.write((total.read() or 0) + number)
    end.set(w.max_timestamp())

  @userstate.on_timer(END)
  def emit(
    self,
    key=beam.DoFn.KeyParam,
    count=beam.DoFn.StateParam(COUNT),
    total=beam.DoFn.StateParam(TOTAL),
  ):
    yield key, count.read() or 0, total.read() or 0


class Write(beam.DoFn):
  def __init__(self, output):
    self.output = output

  def process(self, result):
    key, count, total = result
    path = os.path.join(self.output, '%d.json' % key)
    with open(path + '.tmp', 'w') as f:
      json.dump({'count': count, 'total': total}, f)
    os.replace(path + '.tmp', path)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--job_endpoint', required=True)
  parser.add_argument('--output', required=True)
  parser.add_argument('--numbers', type=int, required=True)
  parser.add_argument('--poison', required=True)
  parser.add_argument('--poison_at', type=int, required=True)
  parser.add_argument('--boot', required=True)
  args = parser.parse_args()
  options = PipelineOptions(
    [
      '--runner=PortableRunner',
      '--job_endpoint=' + args.job_endpoint,
      '--environment_type=PROCESS',
      '--environment_config=' + json.dumps({'command': args.boot}),
    ]
  )
  p = beam.Pipeline(options=options)
  _ = (
    p
    | beam.Create(list(range(args.numbers)))
    | beam.Reshuffle()
    | 'Key' >> beam.Map(lambda i: (i % 3, i))
    | 'Count' >> beam.ParDo(Count(args.poison, args.poison_at))
    | 'Write' >> beam.ParDo(Write(args.output))
  )
  result = p.run()
  print(result._job_id, flush=True)


if __name__ == '__main__':
  main()
