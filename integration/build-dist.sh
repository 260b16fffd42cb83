#!/usr/bin/env bash
# Builds the refract binary to hand out: Cargo's `dist` profile (thin LTO,
# no symbols) with GCC's C++ library linked in statically, so the binary
# needs nothing but glibc 2.34 or newer (every glibc Linux released since
# August 2021: RHEL 9, Ubuntu 22.04, Debian 12, Fedora 35 and later),
# whatever C++ library the host has.
#
#   integration/build-dist.sh           # prints the binary's path
#   integration/build-dist.sh --wheel   # also the refract-beam wheel of it
#                                       # (manylinux_2_34), into $REFRACT_DIST
#
# About 15 minutes on 2 cores (RocksDB's C++ is compiled for this profile).
# Then the binary's dynamic needs are checked: glibc symbols no newer than
# 2.34 and no shared C++ library, else the script fails saying what the
# binary asks for. Needs binutils' objdump.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

wheel=false
case "${1:-}" in
  "") ;;
  --wheel) wheel=true ;;
  *)
    echo "usage: integration/build-dist.sh [--wheel]" >&2
    exit 2
    ;;
esac

# The cc crate links the C++ library named here: statically, and not bundled
# into the rlib (rustc would look for libstdc++.a itself, outside GCC's
# search path), so the final link finds it where the C++ compiler keeps it.
export CXXSTDLIB=static:-bundle=stdc++
GLIBC_FLOOR=2.34

# GCC's C++ library calls one glibc 2.36 function; the feature defines it
# in the binary (runner/src/glibc_compat.rs).
FEATURES=glibc-2-34

echo "== cargo build --profile dist -p refract --features $FEATURES (CXXSTDLIB=$CXXSTDLIB)" >&2
(cd "$REFRACT_ROOT" && cargo build --profile dist -p refract --features "$FEATURES" >&2)
bin=$CARGO_TARGET_DIR/dist/refract

# What the binary needs from the system.
needed=$(objdump -p "$bin" | awk '/NEEDED/ {print $2}')
if grep -q 'libstdc++' <<<"$needed"; then
  echo "build-dist.sh: $bin still links libstdc++ dynamically: $needed" >&2
  exit 1
fi
newest=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)
if [ "$(printf '%s\n%s\n' "$newest" "$GLIBC_FLOOR" | sort -V | tail -n 1)" != "$GLIBC_FLOOR" ]; then
  echo "build-dist.sh: $bin needs glibc $newest, newer than $GLIBC_FLOOR" >&2
  exit 1
fi
echo "== $bin needs glibc $newest and: $(tr '\n' ' ' <<<"$needed")" >&2
echo "$bin"

if $wheel; then
  dist=${REFRACT_DIST:-$REFRACT_ROOT/dist}
  mkdir -p "$dist"
  echo "== maturin build --profile dist --compatibility manylinux_2_34 (-> $dist)" >&2
  (cd "$here/wheel" &&
    "$REFRACT_PY" -m maturin build --profile dist --features "$FEATURES" \
      --compatibility manylinux_2_34 --out "$dist" >&2)
  # The newest such wheel: the one just built.
  newest=
  for wheel_file in "$dist"/refract_beam-*manylinux_2_34*.whl; do
    if [ -z "$newest" ] || [ "$wheel_file" -nt "$newest" ]; then
      newest=$wheel_file
    fi
  done
  echo "$newest"
fi
