#!/usr/bin/env bash
# Builds the refract-beam Python package: a platform wheel holding the
# release `refract` binary (installed as the environment's `refract`
# script) and the `refract_beam` package (RefractRunner, the pytest plugin
# behind `pytest --refract`, the worker boot program), from
# integration/wheel with maturin.
#
#   integration/build-wheel.sh
#
# Writes the wheel into $REFRACT_DIST (default: dist/ in the repository,
# which git ignores) and prints its path. maturin builds the binary with
# cargo's release profile into $CARGO_TARGET_DIR, so it reuses a
# `cargo build --release` made before (about 90 s on 2 cores when the refract
# crate itself had to be compiled again).
# maturin itself comes from integration/requirements.txt (setup.sh).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

dist=${REFRACT_DIST:-$REFRACT_ROOT/dist}
mkdir -p "$dist"
if ! "$REFRACT_PY" -m maturin --version >/dev/null 2>&1; then
  echo "build-wheel.sh: maturin is missing from $REFRACT_VENV; run integration/setup.sh" >&2
  exit 1
fi
log=$(mktemp -t refract-wheel.XXXXXX)
trap 'rm -f "$log"' EXIT
echo "== maturin build --release (integration/wheel -> $dist)" >&2
if ! (cd "$here/wheel" && "$REFRACT_PY" -m maturin build --release --out "$dist") >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
# maturin's last line names the wheel it wrote.
wheel=$(sed -n 's/.*Built wheel[^/]*\(\/.*\.whl\).*/\1/p' "$log" | tail -n 1)
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
  cat "$log" >&2
  echo "build-wheel.sh: maturin did not say which wheel it built" >&2
  exit 1
fi
echo "$wheel"
