#!/usr/bin/env bash
# Builds SeaweedFS (`weed`), the S3-compatible object store the checkpoint
# store tests write to, from the Go module proxy, and prints the binary's
# path.
#
#   integration/seaweedfs/build-seaweedfs.sh
#
# The module is fetched at the version below and built in a copy of its
# source (its go.mod has replace directives, which `go install PKG@V`
# refuses). The binary is cached under ~/.cache/refract/seaweedfs/, with
# Go's module and build caches beside it, so a second run builds nothing.
# The first build takes several minutes on two cores. Needs Go (1.26 or
# newer, as SeaweedFS's go.mod asks).
set -euo pipefail

module=github.com/seaweedfs/seaweedfs
version=v0.0.0-20261109003541-7506e5f91cd6
cache=${REFRACT_CACHE:-$HOME/.cache/refract}
bin=$cache/seaweedfs/weed-$version
if [ ! -x "$bin" ]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "build-seaweedfs.sh: needs Go on PATH" >&2
    exit 1
  fi
  mkdir -p "$cache/seaweedfs"
  echo "build-seaweedfs.sh: building SeaweedFS $version (once)" >&2
  export GOMODCACHE=$cache/go-mod GOCACHE=$cache/go-build GOFLAGS=-mod=mod
  dir=$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  if [ -z "$dir" ]; then
    echo "build-seaweedfs.sh: the Go module proxy did not give $module@$version" >&2
    exit 1
  fi
  work=$(mktemp -d "$cache/seaweedfs/src.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  cp -r "$dir/." "$work"
  chmod -R u+w "$work"
  (cd "$work" && go build -trimpath -o "$bin.tmp" ./weed) >&2
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
