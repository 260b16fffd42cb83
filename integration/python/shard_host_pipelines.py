"""Submits the keyed pipelines of the shard tests as one job, its SDK
workers started as processes (PROCESS environment) wherever the runner
runs the job's engines, and waits for it: GroupByKey after a Reshuffle,
lifted CombinePerKey, an AsDict side input, a bag and an event-time timer
per key and window, and session windows (test_shards.py), each checked
with `assert_that`, so a lost, duplicated or early-fired element fails the
job. Prints the job's id, then its terminal state.

For tests whose runner is on another (virtual) host, where a LOOPBACK
worker in the test's process could not be reached. The workers import
test_shards, so the runner's hosts need this folder on PYTHONPATH.

  python shard_host_pipelines.py --job_endpoint HOST:PORT --boot python_boot.sh [--streaming]
"""

import argparse
import json

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from test_shards import count_and_weigh_words, count_sessions, sum_at_window_ends


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--job_endpoint', required=True)
  parser.add_argument('--boot', required=True, help='the PROCESS boot command')
  parser.add_argument('--streaming', action='store_true')
  args = parser.parse_args()
  options = PipelineOptions(
    [
      '--runner=PortableRunner',
      '--job_endpoint=' + args.job_endpoint,
      '--environment_type=PROCESS',
      '--environment_config=' + json.dumps({'command': args.boot}),
    ]
    + (['--streaming'] if args.streaming else [])
  )
  p = beam.Pipeline(options=options)
  count_and_weigh_words(p)
  sum_at_window_ends(p)
  count_sessions(p)
  result = p.run()
  print(result._job_id, flush=True)  # pylint: disable=protected-access
  print(result.wait_until_finish(), flush=True)


if __name__ == '__main__':
  main()
