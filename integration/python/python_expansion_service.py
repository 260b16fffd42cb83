"""Python's expansion service, as Beam's cross-language tests need it.

Beam's `validate_runner_xlang_test.py` expands `beam:transforms:xlang:test:*`
transforms through an expansion service at localhost:$EXPANSION_PORT. The
SDK registers those transforms in `expansion_service_test`, which its
stock launcher does not import, and that launcher answers with a Docker
image only. This one imports them and serves, on loopback only:

- the expansion service, whose environments offer both the SDK's
  container and a worker pool in this process (`beam:env:anyof:v1`);
- that worker pool (BeamFnExternalWorkerPool), so a runner that picks it
  needs no Docker;
- artifact retrieval, for the environments' dependencies.

    python python_expansion_service.py PORT

runs until SIGTERM or SIGINT.
"""

import logging
import signal
import sys

import grpc
# Imported for its side effect: it registers the xlang test transforms.
import apache_beam.runners.portability.expansion_service_test  # pylint: disable=unused-import
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_artifact_api_pb2_grpc
from apache_beam.portability.api import beam_expansion_api_pb2_grpc
from apache_beam.portability.api import beam_fn_api_pb2_grpc
from apache_beam.runners.portability import artifact_service
from apache_beam.runners.portability import expansion_service
from apache_beam.runners.worker import worker_pool_main
from apache_beam.utils import thread_pool_executor


def serve(port):
  address = 'localhost:%d' % port
  server = grpc.server(thread_pool_executor.shared_unbounded_instance())
  beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(
      worker_pool_main.BeamFnExternalWorkerPoolServicer(), server)
  options = PipelineOptions(
      ['--experiments=beam_fn_api', '--sdk_location=container'])
  beam_expansion_api_pb2_grpc.add_ExpansionServiceServicer_to_server(
      expansion_service.ExpansionServiceServicer(
          options, loopback_address=address),
      server)
  beam_artifact_api_pb2_grpc.add_ArtifactRetrievalServiceServicer_to_server(
      artifact_service.ArtifactRetrievalService(
          artifact_service.BeamFilesystemHandler(None).file_reader),
      server)
  if server.add_insecure_port(address) == 0:
    sys.exit('cannot listen on %s' % address)
  server.start()
  logging.info('expansion service and worker pool listening on %s', address)

  def stop(unused_signum, unused_frame):
    server.stop(None)

  signal.signal(signal.SIGTERM, stop)
  signal.signal(signal.SIGINT, stop)
  server.wait_for_termination()


if __name__ == '__main__':
  logging.getLogger().setLevel(logging.INFO)
  if len(sys.argv) != 2:
    sys.exit('usage: python_expansion_service.py PORT')
  serve(int(sys.argv[1]))
