"""Submits pipelines to a Refract job service with the Python SDK's own
PortableRunner client code, the way `pipeline.run()` does.

Usage: python submit.py <job endpoint>. Prints one `RESULT ...` line per
check and exits non-zero on any unexpected outcome.
"""

import sys

import apache_beam as beam
from apache_beam.metrics import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions


def options(endpoint, outcome):
  return PipelineOptions(
    [
      '--runner=PortableRunner',
      '--job_endpoint=' + endpoint,
      '--environment_type=LOOPBACK',
      '--save_main_session',
      # Announced by the server through DescribePipelineOptions; without
      # that it would be dropped as an unknown flag.
      '--refract_test_outcome=' + outcome,
    ]
  )


def build(p):
  _ = p | beam.Create([1, 2, 3]) | 'count1' >> beam.Map(lambda x: x)


def main(endpoint):
  p = beam.Pipeline(options=options(endpoint, 'done'))
  build(p)
  result = p.run()
  state = result.wait_until_finish()
  print('RESULT state', state)
  counters = result.metrics().query(MetricsFilter().with_name('counter'))['counters']
  print('RESULT counters', sorted((c.key.step, c.committed, c.attempted) for c in counters))
  dists = result.metrics().query(MetricsFilter().with_name('distribution'))['distributions']
  print(
    'RESULT distributions',
    [(d.committed.count, d.committed.sum, d.committed.min, d.committed.max) for d in dists],
  )

  p = beam.Pipeline(options=options(endpoint, 'fail'))
  build(p)
  try:
    p.run().wait_until_finish()
    print('RESULT failing pipeline did not raise')
    return 1
  except RuntimeError as e:
    print('RESULT error', repr(str(e)))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1]))
