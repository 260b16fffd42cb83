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

The Go SDK's cross-language tests send the same test transforms, written
against Beam's Java test expansion service (not published to Maven). Their
configuration rows name fields the Go way, capitalized (`Data`), which
Java's setters match whatever the case and Python's test transforms do not;
this service lower-cases the first letter of such field names before
expanding a `beam:transforms:xlang:test:*` transform. Go also sends the
transform's input PCollections without the transforms that produce them,
which Python's service looks up: it gets a placeholder producer for each,
removed from the answer.

    python python_expansion_service.py PORT

runs until SIGTERM or SIGINT.
"""

import logging
import signal
import sys

import grpc

# Imported for its side effect: it registers the xlang test transforms.
import apache_beam.runners.portability.expansion_service_test  # noqa: F401  # pylint: disable=unused-import
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_artifact_api_pb2_grpc
from apache_beam.portability.api import external_transforms_pb2
from apache_beam.portability.api import beam_expansion_api_pb2_grpc
from apache_beam.portability.api import beam_fn_api_pb2_grpc
from apache_beam.runners.portability import artifact_service
from apache_beam.runners.portability import expansion_service
from apache_beam.runners.worker import worker_pool_main
from apache_beam.utils import thread_pool_executor


TEST_TRANSFORMS = 'beam:transforms:xlang:test:'


class GoFriendlyExpansionService(expansion_service.ExpansionServiceServicer):
  """Python's expansion service, reading Go's capitalized field names."""

  def Expand(self, request, context=None):
    spec = request.transform.spec
    if spec.urn.startswith(TEST_TRANSFORMS) and spec.payload:
      config = external_transforms_pb2.ExternalConfigurationPayload()
      try:
        config.ParseFromString(spec.payload)
      except Exception:  # pylint: disable=broad-except
        config = None
      if config is not None and config.schema.fields:
        for field in config.schema.fields:
          field.name = field.name[:1].lower() + field.name[1:]
        spec.payload = config.SerializeToString()
    placeholders = self._add_placeholder_producers(request)
    response = super().Expand(request, context)
    for transform_id in placeholders:
      if transform_id in response.components.transforms:
        del response.components.transforms[transform_id]
    return response

  @staticmethod
  def _add_placeholder_producers(request):
    """Gives each input PCollection without a producer a placeholder one;
    returns their transform ids."""
    components = request.components
    produced = {pcoll for t in components.transforms.values() for pcoll in t.outputs.values()}
    placeholders = []
    for pcoll in sorted(set(request.transform.inputs.values()) - produced):
      transform_id = 'refract_input_producer_%d' % len(placeholders)
      components.transforms[transform_id].unique_name = transform_id
      components.transforms[transform_id].outputs['out'] = pcoll
      placeholders.append(transform_id)
    return placeholders


def serve(port):
  address = 'localhost:%d' % port
  server = grpc.server(thread_pool_executor.shared_unbounded_instance())
  beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(
    worker_pool_main.BeamFnExternalWorkerPoolServicer(), server
  )
  options = PipelineOptions(['--experiments=beam_fn_api', '--sdk_location=container'])
  beam_expansion_api_pb2_grpc.add_ExpansionServiceServicer_to_server(
    GoFriendlyExpansionService(options, loopback_address=address), server
  )
  beam_artifact_api_pb2_grpc.add_ArtifactRetrievalServiceServicer_to_server(
    artifact_service.ArtifactRetrievalService(
      artifact_service.BeamFilesystemHandler(None).file_reader
    ),
    server,
  )
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
