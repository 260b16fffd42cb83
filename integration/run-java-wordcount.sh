#!/usr/bin/env bash
# The Java SDK on Refract: builds integration/java (Maven), runs its WordCount
# over integration/wordcount/input.txt on Beam's DirectRunner and four times
# on Refract: through Beam's PortableRunner with LOOPBACK workers (inside the
# submitting JVM), the same with the job on three engine shards
# (--experiments=refract_shards=3), with an EXTERNAL environment served by a Java worker pool
# started beforehand as its own process, and by name with
# `--runner=RefractRunner` (integration/java/refract-runner, installed by
# install-java-runner.sh after its own tests) — and compares the outputs.
# Exits non-zero if a run fails or an output differs.
#
#   integration/run-java-wordcount.sh [extra WordCount/pipeline options...]
#
# Needs: java (17+), mvn, and a refract binary (built here if none is found).
# Maven's repository cache is $REFRACT_CACHE/m2 (default ~/.cache/refract/m2),
# never inside the clone.
#
# Environment knobs:
#   REFRACT_BIN       the refract binary to run; default: the release build in
#                     $CARGO_TARGET_DIR if there is one, else the debug build
#                     (built with `cargo build -p refract` if missing)
#   REFRACT_JOB_PORT  job port to use (default: a free one)
#   REFRACT_LOG       passed on to refract (e.g. debug)
#   REFRACT_KEEP=1    keep the work directory (outputs and logs)
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"
cd "$REFRACT_ROOT"

refract_python_or_system

classpath=$(refract_java_classpath)

bin=$(refract_find_bin)

work=$(mktemp -d -t refract-java-wc.XXXXXX)
log=$work/refract.log
port=${REFRACT_JOB_PORT:-$(refract_free_port)}
refract_start_server "$bin" "$port" "$log"
pool=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  if [ -n "$pool" ]; then kill "$pool" 2>/dev/null || true; fi
  refract_stop_server
  if [ "${REFRACT_KEEP:-0}" = 1 ]; then
    echo "== kept $work" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

refract_await_server "$port" "$log"

input=$here/wordcount/input.txt
run_wordcount() {
  local name=$1
  shift
  local start=$SECONDS rc=0
  echo "== running the Java word count on $name" >&2
  java -cp "$classpath" org.refract.examples.WordCount \
    --input="$input" --output="$work/$name.txt" "$@" \
    >"$work/$name.log" 2>&1 || rc=$?
  echo "== $name: exit $rc after $((SECONDS - start))s" >&2
  if [ "$rc" -ne 0 ]; then
    tail -n 40 "$work/$name.log" >&2
  fi
  return "$rc"
}

rc=0
run_wordcount refract --runner=PortableRunner --jobEndpoint="localhost:$port" \
  --defaultEnvironmentType=LOOPBACK "$@" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "== last lines of the refract log:" >&2
  tail -n 50 "$log" >&2
  exit "$rc"
fi
# The same on three engine shards: Count.perElement's keys are split over
# three engines, and the counts must not change.
run_wordcount refract-shards --runner=PortableRunner --jobEndpoint="localhost:$port" \
  --defaultEnvironmentType=LOOPBACK --experiments=refract_shards=3 "$@" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "== last lines of the refract log:" >&2
  tail -n 50 "$log" >&2
  exit "$rc"
fi
# EXTERNAL: a Java worker pool of its own (as Beam's Java container runs in
# worker-pool mode); Refract asks it for workers with StartWorker.
pool_port=$(refract_free_port)
echo "== starting a Java worker pool on port $pool_port" >&2
PIPELINE_OPTIONS="{\"beam:option:environment_options:v1\":[\"external_service_address=localhost:$pool_port\"]}" \
  java -cp "$classpath" org.apache.beam.fn.harness.ExternalWorkerService \
  </dev/null >"$work/pool.log" 2>&1 &
pool=$!
if ! refract_wait_for_port "$pool_port" "$pool" 60; then
  tail -n 30 "$work/pool.log" >&2
  exit 1
fi
run_wordcount refract-external --runner=PortableRunner --jobEndpoint="localhost:$port" \
  --defaultEnvironmentType=EXTERNAL --defaultEnvironmentConfig="localhost:$pool_port" "$@" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "== last lines of the refract log:" >&2
  tail -n 50 "$log" >&2
  exit "$rc"
fi

# By name, with the runner that starts its own server (integration/java/refract-runner,
# installed here after its own tests ran on $bin).
runner_jar=$("$here/install-java-runner.sh" -Dmaven.repo.local="$REFRACT_CACHE/m2")
classpath=$classpath:$runner_jar
run_wordcount refract-by-name --runner=RefractRunner --refractLocation="$bin" "$@" || rc=$?
if [ "$rc" -ne 0 ]; then
  exit "$rc"
fi

run_wordcount direct --runner=DirectRunner "$@"

sort "$work/direct.txt" >"$work/direct.sorted"
for name in refract refract-shards refract-external refract-by-name; do
  sort "$work/$name.txt" >"$work/$name.sorted"
  if ! diff -u "$work/direct.sorted" "$work/$name.sorted" >"$work/diff.txt"; then
    echo "== FAIL: Refract's output ($name) differs from the DirectRunner's:" >&2
    head -n 40 "$work/diff.txt" >&2
    exit 1
  fi
done
echo "== OK: Refract (LOOPBACK, on three shards, EXTERNAL, RefractRunner) and the DirectRunner agree ($(wc -l <"$work/refract.txt") words); most common:" >&2
# (sorted to a file first: `sort | head` would fail with SIGPIPE under pipefail)
sort -t: -k2 -n -r "$work/refract.txt" >"$work/top.txt"
head -n 5 "$work/top.txt"
