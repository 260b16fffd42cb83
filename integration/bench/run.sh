#!/usr/bin/env bash
# Refract's end-to-end benchmarks, one command (see docs/benchmarks.md):
#
#   integration/bench/run.sh [--workloads gbk,pardo,combine,wordcount,tiny,suite]
#
# 1. integration/setup.sh (Python virtualenv with apache-beam, at
#    $REFRACT_VENV, default ~/.cache/refract/venv);
# 2. builds refract (cargo build --release -p refract) unless
#    REFRACT_SKIP_CARGO=1 (then $REFRACT_BIN is used);
# 3. builds Prism at the venv's Beam version with `go install
#    github.com/apache/beam/sdks/v2/go/cmd/prism@vX.Y.Z`, GOPATH and the
#    module cache under $REFRACT_CACHE/go (never inside the clone); if Go is
#    missing or the build fails, Prism is skipped with a message;
# 4. integration/bench/bench.py: starts Refract, Beam's Python job server
#    and Prism as job servers, runs every workload against each, prints a
#    table (seconds and ratios; p50/p95 for the tiny jobs).
#
# Every client submits with --runner=PortableRunner --environment_type=LOOPBACK;
# integration/bench/sitecustomize.py (first on PYTHONPATH for clients and
# servers) makes time.sleep(0) a no-op for every runner alike.
#
# Environment knobs (sizes: see bench.py / docs/benchmarks.md):
#   REFRACT_SKIP_CARGO=1        don't build; use $REFRACT_BIN
#   REFRACT_PRISM_BIN           use this prism binary instead of building one
#   REFRACT_BENCH_NO_PRISM=1    skip Prism
#   REFRACT_BENCH_WORKLOADS     same as --workloads
#   REFRACT_BENCH_GBK_RECORDS, _PARDO_RECORDS, _PARDO_STEPS, _COMBINE_RECORDS,
#   _WORDCOUNT_MB, _TINY_JOBS, _REPEATS, _TIMEOUT
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common.sh
. "$here/../common.sh"
cd "$REFRACT_ROOT"

case "${1:-}" in
  -h | --help)
    sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac

log() { printf 'bench: %s\n' "$*" >&2; }

"$REFRACT_ROOT/integration/setup.sh"

if [ "${REFRACT_SKIP_CARGO:-0}" = 1 ]; then
  bin=${REFRACT_BIN:?REFRACT_SKIP_CARGO=1 needs REFRACT_BIN}
else
  log "building refract (cargo build --release -p refract)"
  cargo build --release -p refract
  bin=$CARGO_TARGET_DIR/release/refract
fi
bin=$(realpath "$bin")

# Prism, from the Go module proxy, at the SDK's Beam version.
prism_args=()
if [ "${REFRACT_BENCH_NO_PRISM:-0}" = 1 ]; then
  log "skipping Prism (REFRACT_BENCH_NO_PRISM=1)"
elif [ -n "${REFRACT_PRISM_BIN:-}" ]; then
  prism_args=(--prism "$(realpath "$REFRACT_PRISM_BIN")")
else
  beam_version=$("$REFRACT_PY" -c 'import apache_beam; print(apache_beam.__version__)' 2>/dev/null)
  gocache=$REFRACT_CACHE/go
  prism=$gocache/bin/prism-$beam_version
  if [ ! -x "$prism" ]; then
    if ! command -v go >/dev/null 2>&1; then
      log "SKIPPING Prism: no 'go' on PATH (install Go, or set REFRACT_PRISM_BIN)"
    else
      log "building Prism $beam_version (go install .../go/cmd/prism@v$beam_version, cache $gocache)"
      mkdir -p "$gocache/bin"
      if GOPATH=$gocache GOMODCACHE=$gocache/pkg/mod GOBIN=$gocache/bin \
        GOFLAGS=-modcacherw go install \
        "github.com/apache/beam/sdks/v2/go/cmd/prism@v$beam_version" >&2; then
        mv "$gocache/bin/prism" "$prism"
      else
        log "SKIPPING Prism: go install failed (see above)"
      fi
    fi
  fi
  if [ -x "$prism" ]; then
    prism_args=(--prism "$prism")
  fi
fi

log "refract: $bin"
exec "$REFRACT_PY" "$here/bench.py" --refract "$bin" "${prism_args[@]}" "$@"
