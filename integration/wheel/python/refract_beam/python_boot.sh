#!/usr/bin/env bash
# Boot command for Beam Python SDK workers in PROCESS environments, without
# Docker. A runner starts it as
#
#   python_boot.sh --id=ID --control_endpoint=HOST:PORT \
#     --logging_endpoint=HOST:PORT --provision_endpoint=HOST:PORT \
#     --artifact_endpoint=HOST:PORT
#
# (flags may also be given as "--flag VALUE"). Like the boot program in
# Beam's Python container, it (with python_worker.py, which must be beside
# it) asks the provision service for the pipeline options and runner
# capabilities, fetches the staged files (for example the pickled main
# session of --save_main_session) from the artifact service, sets the
# environment variables the harness reads, and runs Beam's harness
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

# A directory for the worker's staged files: the one it is given, or one
# of its own (a pool, such as Beam's worker_pool_main, gives none). The
# worker removes its own when its harness ends; one whose worker was killed
# first (worker_pool_main kills a worker a second after StopWorker) goes
# when a later worker starts here: its name carries the pid of the process
# that made it (this one, which becomes the worker or, with a fork server,
# waits for it), and a directory of this user's whose process is gone is
# removed.
semi=${SEMI_PERSISTENT_DIRECTORY:-}
semi_owned=
if [ -z "$semi" ]; then
  tmp=${TMPDIR:-/tmp}
  for old in "$tmp"/refract-worker-*.pid*.*; do
    pid=${old##*.pid}
    pid=${pid%%.*}
    case "$pid" in '' | *[!0-9]*) continue ;; esac
    if [ -d "$old" ] && [ -O "$old" ] && ! kill -0 "$pid" 2>/dev/null; then
      rm -rf -- "$old" || true
    fi
  done
  semi=$(mktemp -d -t "refract-worker-${id:-x}.pid$$.XXXXXX")
  semi_owned=1
fi
mkdir -p "$semi/staged"

# python_worker.py, beside this script, provisions the worker and runs the
# harness in the same interpreter — or, with REFRACT_FORKSERVER set, has a
# fork server that imported Beam already start it. It is read from stdin so
# that the working directory comes first on sys.path; its arguments only
# name it for `ps` and `pgrep`. It fails loudly if the runner's provision or
# artifact service does not answer.
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
BOOT_ID=$id BOOT_CONTROL=$control BOOT_LOGGING=$logging \
  BOOT_PROVISION=$provision BOOT_ARTIFACT=$artifact BOOT_SEMI=$semi \
  BOOT_SEMI_OWNED=$semi_owned \
  exec "$python" - apache_beam.runners.worker.sdk_worker_main "--id=$id" \
  <"$here/python_worker.py"
