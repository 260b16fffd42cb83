#!/usr/bin/env bash
# Installs what Refract's build and end-to-end tests need, on a fresh Debian
# machine (as root). Idempotent: a rerun that finds everything in place
# installs nothing and prints nothing.
#
#   integration/setup.sh              install what is missing
#   integration/setup.sh --print-env  also print `export ...` lines, for
#                                     eval "$(integration/setup.sh --print-env)"
#
# What it sets up:
#   - protoc and protobuf's well-known .proto files (Debian's
#     protobuf-compiler, libprotobuf-dev), needed by the beam-proto crate;
#   - libclang-dev, only once the workspace depends on bindgen (rocksdb);
#   - a JDK (17+) and Maven, for the Java SDK tests (integration/java);
#   - Chromium, for the headless browser test of the web UI;
#   - Go, to build the OpenTelemetry Collector of the OTLP test;
#   - SeaweedFS (built with Go), the S3-compatible object store of the
#     checkpoint store tests;
#   - the clippy and rustfmt components of the Rust toolchain;
#   - a Python virtualenv at $REFRACT_VENV (default ~/.cache/refract/venv,
#     never inside the clone) with the packages in integration/requirements.txt
#     and integration/ray/requirements.txt. It is reinstalled only when those
#     files or the base Python change.
#
# Environment: REFRACT_PYTHON picks the base interpreter (default: python3).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

print_env=0
case "${1:-}" in
  --print-env) print_env=1 ;;
  '') ;;
  -h | --help)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "usage: $0 [--print-env]" >&2
    exit 2
    ;;
esac

log() { printf 'refract setup: %s\n' "$*" >&2; }

# Runs a command quietly; shows its output only if it fails.
quiet() {
  local out
  out=$(mktemp)
  if ! "$@" >"$out" 2>&1; then
    cat "$out" >&2
    rm -f "$out"
    log "failed: $*"
    return 1
  fi
  rm -f "$out"
}

apt_updated=0
apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    log "please install these packages by hand: $*"
    return 1
  fi
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
  if [ "$apt_updated" -eq 0 ]; then
    quiet "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    apt_updated=1
  fi
  log "installing $* (apt-get)"
  quiet "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "$@"
}

# --- system packages -------------------------------------------------------
# beam-proto's protos import protobuf's well-known types (descriptor.proto),
# which Debian ships in libprotobuf-dev, not with protoc itself: a machine
# with protoc alone fails the build with "descriptor.proto: File not found".
if ! command -v protoc >/dev/null 2>&1 ||
  [ ! -f /usr/include/google/protobuf/descriptor.proto ]; then
  apt_install protobuf-compiler libprotobuf-dev
fi

# The Java SDK tests build integration/java with Maven on a JDK.
if ! command -v mvn >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
  apt_install maven default-jdk-headless
fi

# CI (.ci/run) checks every shell script with shellcheck.
if ! command -v shellcheck >/dev/null 2>&1; then
  apt_install shellcheck
fi

# The web UI's end-to-end test drives a headless Chromium.
if ! command -v chromium >/dev/null 2>&1; then
  apt_install chromium
fi

# The OTLP test builds an OpenTelemetry Collector from the Go module proxy
# (integration/otel/build-collector.sh); a newer Go toolchain than Debian's
# is fetched by Go itself when the module asks for one.
if ! command -v go >/dev/null 2>&1; then
  apt_install golang-go
fi

# bindgen (pulled in by rocksdb) needs libclang at build time.
if [ -f "$REFRACT_ROOT/Cargo.lock" ] &&
  grep -q '^name = "bindgen"$' "$REFRACT_ROOT/Cargo.lock" &&
  ! dpkg-query -W -f='${Status}' libclang-dev 2>/dev/null | grep -q 'ok installed'; then
  apt_install libclang-dev
fi

# --- Rust --------------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1; then
  log "cargo not found: install Rust with rustup (https://rustup.rs) first"
  exit 1
fi
missing=()
cargo clippy --version >/dev/null 2>&1 || missing+=(clippy)
cargo fmt --version >/dev/null 2>&1 || missing+=(rustfmt)
if [ "${#missing[@]}" -gt 0 ]; then
  if ! command -v rustup >/dev/null 2>&1; then
    log "missing Rust components (${missing[*]}) and no rustup to add them"
    exit 1
  fi
  log "adding Rust components: ${missing[*]}"
  quiet rustup component add "${missing[@]}"
fi

# --- Python virtualenv -------------------------------------------------------
base_python=${REFRACT_PYTHON:-python3}
if ! command -v "$base_python" >/dev/null 2>&1; then
  apt_install python3 python3-venv
  base_python=python3
fi
if ! "$base_python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  log "$base_python is $("$base_python" --version 2>&1); apache-beam 2.78 needs Python >= 3.10"
  exit 1
fi

requirements=$REFRACT_ROOT/integration/requirements.txt
ray_requirements=$REFRACT_ROOT/integration/ray/requirements.txt
stamp_file=$REFRACT_VENV/.refract-setup-stamp
stamp=$(
  {
    cat "$requirements" "$ray_requirements"
    "$base_python" -c 'import sys; print(sys.executable, sys.version)'
  } | sha256sum | cut -d' ' -f1
)

venv_ok() {
  [ -x "$REFRACT_PY" ] &&
    [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp" ] &&
    "$REFRACT_PY" -c 'import sys' >/dev/null 2>&1
}

if ! venv_ok; then
  if [ -d "$REFRACT_VENV" ] && ! "$REFRACT_PY" -c 'import sys' >/dev/null 2>&1; then
    # The base interpreter moved or vanished under an old venv: start over.
    rm -rf "$REFRACT_VENV"
  fi
  if [ ! -x "$REFRACT_PY" ]; then
    mkdir -p "$(dirname "$REFRACT_VENV")"
    if ! "$base_python" -m venv "$REFRACT_VENV" >/dev/null 2>&1; then
      # Debian's python3 ships venv/ensurepip separately.
      rm -rf "$REFRACT_VENV"
      apt_install python3-venv
      quiet "$base_python" -m venv "$REFRACT_VENV"
    fi
  fi
  log "installing Python packages into $REFRACT_VENV (apache-beam, pytest, ray, ...)"
  quiet "$REFRACT_PY" -m pip install --disable-pip-version-check -q \
    -r "$requirements" -r "$ray_requirements"
  # Import what the suites import, so a broken install fails here, not later.
  quiet "$REFRACT_PY" -c 'import apache_beam, pytest, pytest_timeout, parameterized, hamcrest, tenacity, kafka, ray'
  quiet "$REFRACT_VENV/bin/ruff" --version
  echo "$stamp" >"$stamp_file"
fi

# SeaweedFS, the S3-compatible server of the checkpoint store tests: built
# once from the Go module proxy (several minutes), then cached.
if command -v go >/dev/null 2>&1; then
  quiet "$here/seaweedfs/build-seaweedfs.sh"
fi

if [ "$print_env" -eq 1 ]; then
  printf 'export CARGO_TARGET_DIR=%q\n' "$CARGO_TARGET_DIR"
  printf 'export REFRACT_VENV=%q\n' "$REFRACT_VENV"
  # shellcheck disable=SC2016 # $PATH is for the shell that evals this
  printf 'export PATH=%q:"$PATH"\n' "$REFRACT_VENV/bin"
fi
