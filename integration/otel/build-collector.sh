#!/usr/bin/env bash
# Builds the OpenTelemetry Collector that Refract's OTLP test exports to
# (integration/otel/collector: the OTLP receiver and the debug exporter,
# from the Go module proxy), and prints the binary's path.
#
#   integration/otel/build-collector.sh
#
# The binary is cached under ~/.cache/refract/otelcol/, keyed by the
# sources' hash, with Go's module and build caches beside it, so a second
# run builds nothing. Needs Go (1.24 or newer).
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/collector" && pwd)
cache=${REFRACT_CACHE:-$HOME/.cache/refract}
key=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
bin=$cache/otelcol/otelcol-$key
if [ ! -x "$bin" ]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "build-collector.sh: needs Go (1.24 or newer) on PATH" >&2
    exit 1
  fi
  mkdir -p "$cache/otelcol"
  echo "build-collector.sh: building the OpenTelemetry Collector (once)" >&2
  (
    cd "$src"
    GOMODCACHE=$cache/go-mod GOCACHE=$cache/go-build GOFLAGS=-mod=mod \
      go build -trimpath -o "$bin.tmp" .
  ) >&2
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
