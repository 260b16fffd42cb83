#!/usr/bin/env bash
# Boot command for Beam Python SDK workers in PROCESS environments, without
# Docker. A runner starts it as
#
#   python_boot.sh --id=ID --control_endpoint=HOST:PORT \
#     --logging_endpoint=HOST:PORT --provision_endpoint=HOST:PORT \
#     --artifact_endpoint=HOST:PORT
#
# (flags may also be given as "--flag VALUE"). Like the boot program in
# Beam's Python container, it asks the provision service for the pipeline
# options and runner capabilities, fetches the staged files (for example the
# pickled main session of --save_main_session) from the artifact service, sets
# the environment variables the harness reads, and runs Beam's harness
# (`apache_beam.runners.worker.sdk_worker_main`) in the same interpreter.
#
# Unlike Beam's container boot, it installs nothing: the interpreter must
# already have the pipeline's apache-beam version and its dependencies
# (requirements files and extra packages are not installed), and it starts
# one harness, not one per sibling worker id.
#
# The interpreter is $BEAM_PYTHON if set, else Refract's test virtualenv
# (~/.cache/refract/venv, made by integration/setup.sh) if present, else
# python3. Use it from a pipeline with, for example:
#
#   --environment_type=PROCESS \
#   --environment_config='{"command": "/path/to/integration/python_boot.sh"}'
set -euo pipefail

id='' control='' logging='' provision='' artifact=''
while [ "$#" -gt 0 ]; do
  arg=$1
  shift
  case "$arg" in
    --*=*) name=${arg%%=*} value=${arg#*=} ;;
    --id | --control_endpoint | --logging_endpoint | --provision_endpoint | --artifact_endpoint | --semi_persist_dir)
      name=$arg value=${1-}
      if [ "$#" -gt 0 ]; then shift; fi
      ;;
    *)
      echo "python_boot.sh: ignoring argument $arg" >&2
      continue
      ;;
  esac
  case "$name" in
    --id) id=$value ;;
    --control_endpoint) control=$value ;;
    --logging_endpoint) logging=$value ;;
    --provision_endpoint) provision=$value ;;
    --artifact_endpoint) artifact=$value ;;
    --semi_persist_dir) SEMI_PERSISTENT_DIRECTORY=$value ;;
    *) echo "python_boot.sh: ignoring flag $name" >&2 ;;
  esac
done
if [ -z "$control" ]; then
  echo "python_boot.sh: --control_endpoint is required" >&2
  exit 2
fi

python=${BEAM_PYTHON:-}
if [ -z "$python" ]; then
  python=${REFRACT_VENV:-$HOME/.cache/refract/venv}/bin/python
  [ -x "$python" ] || python=python3
fi

semi=${SEMI_PERSISTENT_DIRECTORY:-}
if [ -z "$semi" ]; then
  semi=$(mktemp -d -t "refract-worker-${id:-x}.XXXXXX")
fi
mkdir -p "$semi/staged"

# One interpreter provisions the worker and then runs the harness in
# itself: the variables the harness reads are set in its environment, and
# Beam, imported for the provisioning, is not imported a second time by a
# new process (about a second of CPU per worker). Its arguments only name
# it for `ps` and `pgrep`. It fails loudly if the runner's provision or
# artifact service does not answer.
BOOT_ID=$id BOOT_CONTROL=$control BOOT_LOGGING=$logging \
  BOOT_PROVISION=$provision BOOT_ARTIFACT=$artifact BOOT_SEMI=$semi \
  exec "$python" - apache_beam.runners.worker.sdk_worker_main "--id=$id" <<'PY'
import os
import json
import sys

import grpc
from google.protobuf import json_format
from google.protobuf import text_format

from apache_beam.portability.api import beam_artifact_api_pb2
from apache_beam.portability.api import beam_artifact_api_pb2_grpc
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.portability.api import beam_provision_api_pb2_grpc
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.portability.api import endpoints_pb2
from apache_beam.portability import common_urns

env = os.environ
worker_id = env['BOOT_ID']
metadata = [('worker_id', worker_id)] if worker_id else []
out = {'WORKER_ID': worker_id, 'SEMI_PERSISTENT_DIRECTORY': env['BOOT_SEMI']}


def descriptor(url):
  return text_format.MessageToString(
      endpoints_pb2.ApiServiceDescriptor(url=url), as_one_line=True)


out['CONTROL_API_SERVICE_DESCRIPTOR'] = descriptor(env['BOOT_CONTROL'])
if env['BOOT_LOGGING']:
  out['LOGGING_API_SERVICE_DESCRIPTOR'] = descriptor(env['BOOT_LOGGING'])

options = {}
if env['BOOT_PROVISION']:
  channel = grpc.insecure_channel(env['BOOT_PROVISION'])
  try:
    info = beam_provision_api_pb2_grpc.ProvisionServiceStub(
        channel).GetProvisionInfo(
            beam_provision_api_pb2.GetProvisionInfoRequest(),
            metadata=metadata,
            timeout=60).info
  except grpc.RpcError as e:
    sys.exit(
        'python_boot.sh: GetProvisionInfo at %s failed: %s' %
        (env['BOOT_PROVISION'], e))
  options = json_format.MessageToDict(info.pipeline_options)
  out['RUNNER_CAPABILITIES'] = ' '.join(info.runner_capabilities)
  if info.status_endpoint.url:
    out['STATUS_API_SERVICE_DESCRIPTOR'] = descriptor(info.status_endpoint.url)
  for key in ('job_name', 'job_id'):
    if key in info.metadata:
      out[key.upper()] = info.metadata[key]

  # Staged files (e.g. the pickled main session) go to <semi>/staged/<name>,
  # where the harness looks for them.
  staging_to = common_urns.artifact_roles.STAGING_TO.urn
  artifacts = [d for d in info.dependencies if d.role_urn == staging_to]
  if artifacts and env['BOOT_ARTIFACT']:
    stub = beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub(
        grpc.insecure_channel(env['BOOT_ARTIFACT']))
    for artifact in artifacts:
      name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(
          artifact.role_payload).staged_name
      path = os.path.join(env['BOOT_SEMI'], 'staged', os.path.basename(name))
      try:
        with open(path, 'wb') as f:
          for chunk in stub.GetArtifact(
              beam_artifact_api_pb2.GetArtifactRequest(artifact=artifact),
              metadata=metadata,
              timeout=300):
            f.write(chunk.data)
      except grpc.RpcError as e:
        sys.exit('python_boot.sh: fetching %s failed: %s' % (name, e))
out['PIPELINE_OPTIONS'] = json.dumps(options)

for key in [k for k in os.environ if k.startswith('BOOT_')]:
  del os.environ[key]
os.environ.update(out)
from apache_beam.runners.worker import sdk_worker_main
sdk_worker_main.main([sys.argv[0]])
PY
