#!/usr/bin/env bash
# Runs the TypeScript SDK's own tests against refract and, in the same run,
# against Beam's Python job server, for the counts beside ours.
#
#   integration/ts_suite.sh [BIN] [extra mocha args, e.g. --grep map]
#
# The SDK is npm's apache-beam $REFRACT_TS_BEAM_VERSION (default 2.49.0, the
# newest the registry serves), installed once with mocha under
# $REFRACT_CACHE/ts-suite/VERSION. Its tests ship compiled in the package:
# dist/test/primitives_test.js (whose "portable runner @ulr" cases submit to
# the job service that BEAM_SERVICE_OVERRIDES names for
# `python:apache_beam.runners.portability.local_job_service_main`) and
# dist/test/io_test.js (whose "@xlang" cases read and write files through
# Python's expansion service, started from the virtualenv's Python through
# the `python:*` override; its workers run as processes, no Docker).
#
# Only those cases are counted; the rest of both files run on the SDK's
# in-process direct runner and say nothing about a runner. Fails when a
# counted case fails on refract, or passes on the Python job server and not
# on refract. BIN defaults to $REFRACT_BIN, then
# $CARGO_TARGET_DIR/release/refract.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

bin=$(refract_suite_binary ts_suite.sh "${1:-}")
if [ "$#" -gt 0 ]; then shift; fi
version=${REFRACT_TS_BEAM_VERSION:-2.49.0}
suite_dir=$REFRACT_CACHE/ts-suite/$version
package=$suite_dir/node_modules/apache-beam
report_dir=${REFRACT_REPORT_DIR:-$(mktemp -d -t refract-ts-suite.XXXXXX)}
mkdir -p "$report_dir"

# io_test.js loads BigQuery's client for its Dataflow cases, which the SDK
# lists as a development dependency only. gRPC is pinned to the version
# the SDK's own tree resolves to (through google-gax), so that the SDK and
# its gRPC transport share one copy: credentials made by one copy are
# refused by another ("Channel credentials must be a ChannelCredentials
# object").
dev_packages=(mocha @google-cloud/bigquery @grpc/grpc-js@1.6.12)
if [ ! -f "$package/dist/test/primitives_test.js" ] || [ ! -x "$suite_dir/node_modules/.bin/mocha" ] ||
  [ ! -d "$suite_dir/node_modules/@google-cloud/bigquery" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "ts_suite.sh: needs Node.js with npm on PATH" >&2
    exit 1
  fi
  echo "== installing apache-beam@$version and its test tools from npm (once)" >&2
  mkdir -p "$suite_dir"
  echo '{"name": "refract-ts-suite", "private": true}' >"$suite_dir/package.json"
  (cd "$suite_dir" && npm install --no-audit --no-fund --save-exact --cache "$REFRACT_CACHE/npm" \
    "apache-beam@$version" "${dev_packages[@]}" >&2)
fi

trap 'refract_stop_tracked' EXIT
trap 'refract_kill_bounded; exit 130' INT TERM

# run_mocha NAME: starts NAME's job service (refract or Beam's Python job
# server) and runs both test files against it, writing mocha's JSON report
# to $report_dir/NAME.json.
run_mocha() {
  local name=$1 port
  shift
  port=$(refract_free_port)
  # The @xlang cases' Python transforms name Beam's Python SDK image;
  # with no Docker here they run in the virtualenv's interpreter.
  local server=("$bin" serve --job_port "$port" --serve_http=false --sdk_python "$REFRACT_PY")
  if [ "$name" != refract ]; then
    server=("$REFRACT_PY" -m apache_beam.runners.portability.local_job_service_main --port "$port")
  fi
  refract_start_tracked "$port" "$report_dir/$name-server.log" 120 "${server[@]}"
  echo "== TypeScript SDK $version tests against $name (port $port)" >&2
  local overrides
  overrides=$(printf '{"python:apache_beam.runners.portability.local_job_service_main": "localhost:%s", "python:*": "%s"}' \
    "$port" "$REFRACT_PY")
  (
    cd "$package"
    BEAM_SERVICE_OVERRIDES=$overrides refract_run_bounded 900 \
      "$suite_dir/node_modules/.bin/mocha" --timeout 60000 --exit \
      --reporter json --reporter-option "output=$report_dir/$name.json" \
      dist/test/primitives_test.js dist/test/io_test.js "$@" \
      >"$report_dir/$name-mocha.log" 2>&1 || true
  )
}

run_mocha refract "$@"
run_mocha python "$@"

echo "== TypeScript SDK tests (reports: $report_dir)"
"$REFRACT_PY" "$here/ts/summarize.py" --bar-runner python \
  "$report_dir/refract.json" "$report_dir/python.json"
