"""The Python side of `job_api_streams.rs`: pipelines built by the installed
Beam Python SDK, and the SDK worker pool that runs their code.

Usage: python job_api_peer.py OUT_DIR

Starts an in-process worker pool on a free port (what a LOOPBACK client
starts), then writes into OUT_DIR, as serialized protos, the pipelines the
test submits (their EXTERNAL environment names that pool) and the
pipeline options a client sends with them:

  done.pb     Create([1, 2, 3]) | Map(double): ends DONE
  fail.pb     Create([1]) | Map(raise ValueError): ends FAILED
  slow.pb     Create([1]) | Map(sleep 60 s): runs until cancelled
  options.pb  a google.protobuf.Struct of `beam:option:NAME:v1` entries

prints `READY`, and serves until its standard input closes.
"""

import os
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.job import utils as job_utils
from apache_beam.runners.portability.portable_runner import PortableRunner
from apache_beam.runners.worker import worker_pool_main

FAILURE = 'boom from the DoFn'


def fail(x):
  raise ValueError(FAILURE)


def sleep_a_minute(x):
  time.sleep(60)
  return x


PIPELINES = {
  'done': lambda p: p | beam.Create([1, 2, 3]) | beam.Map(lambda x: 2 * x),
  'fail': lambda p: p | beam.Create([1]) | 'Explode' >> beam.Map(fail),
  'slow': lambda p: p | beam.Create([1]) | 'Sleep' >> beam.Map(sleep_a_minute),
}


def main(out_dir):
  address, _server = worker_pool_main.BeamFnExternalWorkerPoolServicer.start(
    use_process=False, port=0
  )
  options = PipelineOptions(
    [
      '--runner=PortableRunner',
      '--environment_type=EXTERNAL',
      '--environment_config=' + address,
    ]
  )
  for name, build in PIPELINES.items():
    p = beam.Pipeline(options=options)
    build(p)
    proto = PortableRunner.get_proto_pipeline(p, options)
    with open(os.path.join(out_dir, name + '.pb'), 'wb') as f:
      f.write(proto.SerializeToString())
  given = {
    'beam:option:%s:v1' % k: v
    for k, v in options.get_all_options(drop_default=True).items()
    if v is not None
  }
  with open(os.path.join(out_dir, 'options.pb'), 'wb') as f:
    f.write(job_utils.dict_to_struct(given).SerializeToString())
  print('READY', flush=True)
  sys.stdin.read()


if __name__ == '__main__':
  main(sys.argv[1])
