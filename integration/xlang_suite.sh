#!/usr/bin/env bash
# Runs Beam's cross-language suites from the apache-beam wheel against
# refract: io/external/xlang_kafkaio_it_test.py (its hosted cases: KafkaIO
# through Java's expansion service, against a Kafka broker) and
# transforms/validate_runner_xlang_test.py: Python pipelines whose
# `beam:transforms:xlang:test:*` transforms are expanded by a second SDK
# process, Python's test expansion service (python/python_expansion_service.py).
# Its environments arrive as `beam:env:anyof:v1` (a container image, or the
# worker pool inside that process); refract starts the pool's workers, so
# every job runs in two environments and needs no Docker.
#
#   integration/xlang_suite.sh [BIN] [extra pytest args, e.g. -k prefix]
#
# BIN defaults to $REFRACT_BIN, then $CARGO_TARGET_DIR/release/refract.
# Fails when any test fails or fewer pass than integration/xlang_suite_bar.
# The same suites then run on Prism, for the counts beside ours.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

bin=$(refract_suite_binary xlang_suite.sh "${1:-}")
if [ "$#" -gt 0 ]; then shift; fi
# Bars: passes each suite must reach (integration/xlang_suite_bar holds
# "validate N" and "kafka N" lines).
declare -A bars
while read -r suite count; do
  [ -n "$suite" ] && bars[$suite]=$count
done <"$here/xlang_suite_bar"
report_dir=${REFRACT_REPORT_DIR:-$(mktemp -d -t refract-xlang.XXXXXX)}
mkdir -p "$report_dir"
beam_dir=$("$REFRACT_PY" -c 'import apache_beam, os; print(os.path.dirname(apache_beam.__file__))')

expansion_pid='' refract_pid='' prism_pid=''
# shellcheck disable=SC2317 # called by the EXIT trap
stop_services() {
  for pid in $expansion_pid $refract_pid $prism_pid; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in $expansion_pid $refract_pid $prism_pid; do
    wait "$pid" 2>/dev/null || true
  done
}
trap 'stop_services' EXIT
trap 'refract_kill_bounded; exit 130' INT TERM

# run_suite JOB_PORT JUNIT SUITE [pytest args]: one suite against the job
# service on JOB_PORT; returns pytest's status. SUITE `validate` is
# validate_runner_xlang_test with the Python expansion service; `kafka` is
# xlang_kafkaio_it_test's hosted cases, under with_xlang_services.py, which
# starts Java's expansion service and a Kafka broker and points
# EXPANSION_PORT and KAFKA_BOOTSTRAP_SERVER at them.
run_suite() {
  local port=$1 junit=$2 suite=$3
  shift 3
  local wrapper=() file=$beam_dir/transforms/validate_runner_xlang_test.py
  if [ "$suite" = kafka ]; then
    wrapper=("$REFRACT_PY" "$here/python/with_xlang_services.py" "${junit%.xml}-services" --)
    file=$beam_dir/io/external/xlang_kafkaio_it_test.py
  fi
  (
    cd "$here/beam_suite"
    EXPANSION_PORT=$expansion_port PYTHONPATH="$here/beam_suite:$here/python${PYTHONPATH:+:$PYTHONPATH}" \
      refract_run_bounded 900 "${wrapper[@]}" \
      "$REFRACT_PY" -m pytest \
      -p refract_beam_plugin -p no:cacheprovider -c "$here/beam_suite/pytest.ini" \
      --rootdir "$(dirname "$beam_dir")" "$file" \
      --test-pipeline-options="--runner=PortableRunner --job_endpoint=localhost:$port --environment_type=LOOPBACK" \
      --timeout 300 --timeout-method=signal \
      --junitxml "$junit" \
      -v --tb=native --show-capture=no -rfEs --disable-warnings \
      "$@"
  )
}

expansion_port=$(refract_free_port)
"$REFRACT_PY" "$here/python/python_expansion_service.py" "$expansion_port" \
  >"$report_dir/expansion.log" 2>&1 </dev/null &
expansion_pid=$!
job_port=$(refract_free_port)
refract_start_server "$bin" "$job_port" "$report_dir/refract.log" --serve_http=false
refract_pid=$REFRACT_SERVER_PID
refract_await_server "$job_port" "$report_dir/refract.log"
if ! refract_wait_for_port "$expansion_port" "$expansion_pid" 60; then
  tail -n 30 "$report_dir/expansion.log" >&2
  exit 1
fi

verdict=0
for suite in validate kafka; do
  echo "== $suite suite against $bin (bar: ${bars[$suite]} passed, none failed; reports: $report_dir)"
  rc=0
  run_suite "$job_port" "$report_dir/$suite.xml" "$suite" "$@" || rc=$?
  "$REFRACT_PY" "$here/beam_suite/summarize.py" \
    --junit "$report_dir/$suite.xml" \
    --bar "${bars[$suite]}" --all-must-pass --pytest-exit "$rc" --label "xlang-$suite" \
    ${REFRACT_RECORD:+--record "$REFRACT_RECORD"} || verdict=1
done

# The same suite on Prism, Beam's Go runner, in the same run, for the
# counts docs/compatibility.md puts side by side. Informational: it never
# fails this script. REFRACT_XLANG_PEER=none skips it.
if [ "${REFRACT_XLANG_PEER:-prism}" = prism ]; then
  if prism=$(refract_prism_bin); then
    prism_port=$(refract_free_port)
    "$prism" -job_port "$prism_port" -serve_http=false -log_level warn \
      >"$report_dir/prism.log" 2>&1 </dev/null &
    prism_pid=$!
    if refract_wait_for_port "$prism_port" "$prism_pid" 60; then
      for suite in validate kafka; do
        echo "== $suite suite against Prism (peer, informational)"
        prc=0
        run_suite "$prism_port" "$report_dir/prism-$suite.xml" "$suite" "$@" \
          >"$report_dir/prism-$suite.log" 2>&1 || prc=$?
        "$REFRACT_PY" "$here/beam_suite/summarize.py" --junit "$report_dir/prism-$suite.xml" \
          --pytest-exit "$prc" --label "xlang-$suite-prism" || true
      done
    fi
  else
    echo "== no Prism binary: peer counts skipped"
  fi
fi
exit "$verdict"
