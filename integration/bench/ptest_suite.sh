#!/usr/bin/env bash
# A Beam Go user's `go test` suite of small pipelines (ptest) on each runner
# a Go user could pick for it, in one run.
#
#   integration/bench/ptest_suite.sh [BIN]
#
# Compiles integration/bench/go_ptest (Map, GroupByKey, Combine per key, a
# side input, Flatten, tagged outputs, windowed sums; each built and run
# REFRACT_BENCH_GO_REPEAT times, default 5) once with `go test -c`, and
# runs the test binary twice per runner, keeping the faster run:
#
#   Prism (ptest's default)   Beam's Prism in the test process (--runner=prism)
#   direct                    the Go SDK's legacy direct runner
#   refract serve             --runner=universal --endpoint=localhost:P
#                             --environment_type=LOOPBACK, against a warm
#                             `refract serve`
#   refract serve, strict     the same with --experiments=refract_strict
#
# and prints each run's wall time (the test binary's start included) and
# the median of the pipelines' own times (`go test -v`'s per-subtest
# times). BIN (default: the release build) is the refract served.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../common.sh
. "$here/common.sh"
# shellcheck source=suite_runs.sh
. "$here/bench/suite_runs.sh"

bin=$(refract_suite_binary "$0" "${1:-}")
refract_need_go ptest_suite.sh
work=$(mktemp -d -t refract-ptest-bench.XXXXXX)
trap 'refract_stop_tracked; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

test_bin=$REFRACT_CACHE/go-bin/smallpipelines.test
mkdir -p "$(dirname "$test_bin")"
(cd "$here/bench/go_ptest" && GOFLAGS="-mod=mod -buildvcs=false" _refract_go test -c -o "$test_bin" .) >&2

port=$(refract_free_port)
refract_start_tracked "$port" "$work/refract.log" 60 "$bin" serve --job_port "$port" --serve_http=false

universal=("--runner=universal" "--endpoint=localhost:$port" "--environment_type=LOOPBACK")
runners=(
  "Prism (ptest's default)|--runner=prism"
  "direct|--runner=direct"
  "refract serve|${universal[*]}"
  "refract serve, strict|${universal[*]} --experiments=refract_strict"
)

# ptest_times LOG WALL: the pipelines, the wall time and the median
# pipeline's milliseconds of the run just made: each subtest is one
# pipeline, printed as "--- PASS: TestMap/0 (0.12s)".
ptest_times() {
  "$REFRACT_PY" - "$1" "$2" <<'PY'
import re
import statistics
import sys
times = [float(m.group(1)) for m in re.finditer(
    r'--- PASS: \S+/\d+ \(([0-9.]+)s\)', open(sys.argv[1]).read())]
print('%d %.1f %.0f' % (len(times), float(sys.argv[2]), statistics.median(times) * 1000))
PY
}

# run_suite FLAG...: the test binary, in the work directory.
run_suite() {
  (cd "$work" && "$test_bin" -test.v -test.count=1 -test.timeout 600s "$@")
}

echo "| runner | pipelines | suite wall s | median ms per pipeline | per pipeline / Prism |"
echo "|---|---:|---:|---:|---:|"
reference=
for entry in "${runners[@]}"; do
  name=${entry%%|*}
  read -r -a flags <<<"${entry#*|}"
  best=$(suite_best_of_two "$name" ptest_times "$work/run.log" run_suite "${flags[@]}")
  read -r _ _ median <<<"$best"
  reference=${reference:-$median}
  suite_row "$name" "$best" "$reference"
done
