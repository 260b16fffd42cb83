#!/usr/bin/env bash
# Runs Beam's Go SDK test suites against refract and, in the same run,
# against Prism (Beam's Go runner), for the counts beside ours.
#
#   integration/go_suite.sh [BIN] [-test.run REGEX ...]
#
# The suites are the ones Beam runs for Go at $REFRACT_GO_BEAM_VERSION
# (default v2.78.0, from the Go module proxy): test/integration/primitives,
# wordcount, synthetic, xlang (through Python's test expansion service,
# integration/python/python_expansion_service.py), test/regression and the
# ptest-based packages of pkg/beam that need no cloud service or database.
# They are compiled once with `go test -c` in a throwaway module under
# $REFRACT_CACHE/go-suite/VERSION (module and build caches under
# $REFRACT_CACHE/go-mod and go-build), and run three times:
#
#   refract     `--runner=prism --endpoint=localhost:P`: the Go SDK submits
#               to refract's job service and applies Prism's filter list,
#               so it runs exactly the tests Beam expects Prism to pass;
#   prism       the same binaries and flags against Prism itself;
#   universal   `--runner=universal` (no filter list) against refract, only
#               the tests Prism's list filters that need no cloud service:
#               TestTrigger*, TestPanes, TestDrain (with
#               `--experiments=drain_on_start`: its source never ends, so
#               the job must be drained), TestXLang_CoGroupBy and
#               TestKafkaIO (Java's expansion service and a local broker,
#               integration/python/with_xlang_services.py).
#
# Extra arguments go to every test binary. Fails when a test hangs on
# refract, passes on Prism and not on refract, or (universal) fails, unless
# integration/go/expected_failures names it with the reason. BIN defaults to
# $REFRACT_BIN, then $CARGO_TARGET_DIR/release/refract.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

bin=$(refract_suite_binary go_suite.sh "${1:-}")
if [ "$#" -gt 0 ]; then shift; fi
version=${REFRACT_GO_BEAM_VERSION:-v2.78.0}
suite_dir=$REFRACT_CACHE/go-suite/$version
report_dir=${REFRACT_REPORT_DIR:-$(mktemp -d -t refract-go-suite.XXXXXX)}
mkdir -p "$report_dir"
beam_go=$REFRACT_CACHE/go-mod/github.com/apache/beam/sdks/v2@$version/go

# Packages under $beam_go whose tests run, by binary name (Go names a test
# binary after its package, so the names must stay distinct).
packages=(
  test/integration/primitives test/integration/wordcount
  test/integration/synthetic test/integration/xlang
  test/integration/io/xlang/kafka test/regression
  pkg/beam pkg/beam/io/textio pkg/beam/io/fileio pkg/beam/io/avroio
  pkg/beam/io/parquetio pkg/beam/testing/passert pkg/beam/transforms/batch
  pkg/beam/transforms/filter pkg/beam/transforms/periodic
  pkg/beam/transforms/stats pkg/beam/transforms/top pkg/beam/x/debug
)

# build_binaries: `go test -c` of every package into $suite_dir/bin, once
# per version and package list.
build_binaries() {
  local stamp=$suite_dir/bin/.packages start=$SECONDS
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${packages[*]}" ]; then
    return 0
  fi
  refract_need_go go_suite.sh || return 1
  echo "== building Beam's Go test binaries at $version (once)" >&2
  mkdir -p "$suite_dir/mod"
  rm -rf "${suite_dir:?}/bin"
  mkdir -p "$suite_dir/bin"
  printf 'module refract.local/gosuite\n\ngo 1.26\n\nrequire github.com/apache/beam/sdks/v2 %s\n' \
    "$version" >"$suite_dir/mod/go.mod"
  local targets=()
  for p in "${packages[@]}"; do
    targets+=("github.com/apache/beam/sdks/v2/go/$p")
  done
  (
    cd "$suite_dir/mod"
    GOFLAGS=-mod=mod _refract_go mod download github.com/apache/beam/sdks/v2
    GOFLAGS="-mod=mod -buildvcs=false" _refract_go test -c -o "$suite_dir/bin/" "${targets[@]}"
  )
  echo "${packages[*]}" >"$stamp"
  echo "== Go test binaries took $((SECONDS - start))s" >&2
}

trap 'refract_stop_tracked' EXIT
trap 'refract_kill_bounded; exit 130' INT TERM

build_binaries
prism=$(refract_prism_bin)

expansion_port=$(refract_free_port)
refract_start_tracked "$expansion_port" "$report_dir/expansion.log" 120 \
  "$REFRACT_PY" "$here/python/python_expansion_service.py" "$expansion_port"

# start_runner NAME: starts refract or prism on a free port, which it puts
# in $port.
port=
start_runner() {
  local name=$1
  port=$(refract_free_port)
  local server=("$bin" serve)
  if [ "$name" = prism ]; then server=("$prism"); fi
  refract_start_tracked "$port" "$report_dir/$name-server.log" 60 \
    "${server[@]}" --job_port "$port" --serve_http=false
}

# run_binary OUT_DIR PORT RUNNER NAME [flags]: one test binary, from its
# package's source folder (tests read testdata/ relative to it).
run_binary() {
  local out=$1 port=$2 runner=$3 name=$4 package
  shift 4
  for p in "${packages[@]}"; do
    [ "$(basename "$p")" = "$name" ] && package=$p
  done
  local command=("$suite_dir/bin/$name.test" -test.v -test.timeout 600s
    "--runner=$runner" "--endpoint=localhost:$port" --environment_type=LOOPBACK)
  # Only the integration packages define the expansion service flag.
  case $package in
    test/integration/*) command+=("--expansion_addr=test:localhost:$expansion_port") ;;
  esac
  command+=("$@")
  echo "== $(basename "$out"): $name" >&2
  (
    cd "$beam_go/$package"
    refract_run_bounded 700 "${command[@]}" >"$out/$name.log" 2>&1 || true
  )
}

status=0
for runner in refract prism; do
  mkdir -p "$report_dir/$runner"
  start_runner "$runner"
  for p in "${packages[@]}"; do
    name=$(basename "$p")
    # Prism's filter list skips every Kafka test.
    [ "$name" = kafka ] && continue
    skip=()
    # It downloads Beam's expansion service jar from Maven Central, which
    # these machines cannot reach: nothing about the runner.
    [ "$name" = xlang ] && skip=(-test.skip '^TestAutomatedExpansionService$')
    run_binary "$report_dir/$runner" "$port" prism "$name" "${skip[@]}" "$@"
  done
done

mkdir -p "$report_dir/universal"
start_runner universal
run_binary "$report_dir/universal" "$port" universal primitives \
  -test.run '^(TestTrigger.*|TestPanes)$' "$@"
# TestDrain's source never ends: it passes once the job is drained, which
# `--experiments=drain_on_start` asks for as the job starts (Beam drains it
# from outside on Dataflow).
mkdir -p "$report_dir/universal-drain"
run_binary "$report_dir/universal-drain" "$port" universal primitives \
  -test.run '^TestDrain$' --experiments=drain_on_start "$@"
mv "$report_dir/universal-drain/primitives.log" "$report_dir/universal/drain.log"
rmdir "$report_dir/universal-drain"
run_binary "$report_dir/universal" "$port" universal xlang \
  -test.run '^TestXLang_CoGroupBy$' "$@"
(
  cd "$beam_go/test/integration/io/xlang/kafka"
  echo "== universal: kafka" >&2
  # shellcheck disable=SC2016 # $0 and $EXPANSION_PORT are the inner shell's
  refract_run_bounded 900 "$REFRACT_PY" "$here/python/with_xlang_services.py" \
    "$report_dir/universal/kafka-services" -- bash -c \
    'exec "$0" -test.v -test.timeout 600s --runner=universal --endpoint=localhost:'"$port"' \
      --environment_type=LOOPBACK --expansion_addr=io:localhost:$EXPANSION_PORT \
      --bootstrap_servers=$KAFKA_BOOTSTRAP_SERVER "$@"' \
    "$suite_dir/bin/kafka.test" "$@" >"$report_dir/universal/kafka.log" 2>&1 || true
)

echo "== Go suites (reports: $report_dir)"
"$REFRACT_PY" "$here/go/summarize.py" --bar-runner prism \
  "$report_dir/refract" "$report_dir/prism" || status=1
"$REFRACT_PY" "$here/go/summarize.py" \
  --expected-failures "$here/go/expected_failures" "$report_dir/universal" || status=1
exit "$status"
