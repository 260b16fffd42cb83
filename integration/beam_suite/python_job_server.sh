#!/usr/bin/env bash
# A stand-in for the refract binary that serves Beam's own Python job server
# (apache_beam.runners.portability.local_job_service_main) with refract's
# command line. It gives the suites a reference point:
#
#   integration/prism_suite.sh integration/beam_suite/python_job_server.sh
#   REFRACT_BIN=integration/beam_suite/python_job_server.sh \
#     "$REFRACT_PY" -m pytest integration/python
#
# Accepts: [serve] --job_port N (also --job_port=N, -job_port=N); ignores
# --log_level, --log_kind, --serve_http and --idle_shutdown_timeout; --help.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common.sh
. "$here/../common.sh"

usage() {
  echo "usage: $(basename "$0") [serve] --job_port N [--log_level L] [--log_kind K] [--serve_http=BOOL]"
}

port=8099
[ "${1:-}" = serve ] && shift
while [ "$#" -gt 0 ]; do
  arg=$1
  shift
  case "$arg" in
    -h | --help | -help) usage; exit 0 ;;
    --job_port | -job_port) port=${1:?missing value for --job_port}; shift ;;
    --job_port=* | -job_port=*) port=${arg#*=} ;;
    --log_level | --log_kind | -log_level | -log_kind) shift ;;
    --log_level=* | --log_kind=* | -log_level=* | -log_kind=*) ;;
    --serve_http* | -serve_http* | --idle_shutdown_timeout* | -idle_shutdown_timeout*) ;;
    *)
      echo "error: unexpected argument '$arg'" >&2
      usage >&2
      exit 2
      ;;
  esac
done
case "$port" in
  '' | *[!0-9]*) echo "error: invalid --job_port '$port'" >&2; usage >&2; exit 2 ;;
esac
exec "$REFRACT_PY" -m apache_beam.runners.portability.local_job_service_main --port "$port"
