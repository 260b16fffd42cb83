#!/usr/bin/env bash
# Runs the smoke suite (integration/beam_versions/test_smoke.py: a word
# count, TestPipelines, a streaming job with state and timers, a
# cross-language transform) with the refract-beam wheel on every Beam
# Python release Refract supports, each in a virtualenv of its own, and
# prints one line per version. Not in CI (about 2 minutes a version, plus a
# few minutes to make each virtualenv once); its table is in
# docs/compatibility.md.
#
#   integration/beam_versions.sh                 every supported version
#   integration/beam_versions.sh 2.72.0 newest   some of them
#
# `newest` is a virtualenv where pip installs the wheel alone and picks
# apache-beam itself, as a new user's `pip install` does.
#
# The wheel is $REFRACT_WHEEL, else built with integration/build-wheel.sh.
# Virtualenvs live in $REFRACT_CACHE/beam-versions/<version> and are reused
# (`newest` is made again each run).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

# The lowest of these is the lowest Beam Python version Refract supports
# (`refract --version`; a test in runner/src/tested_with.rs keeps the two
# together).
versions=${REFRACT_BEAM_VERSIONS:-2.70.0 2.71.0 2.72.0 2.73.0 2.74.0 2.75.0 2.76.0 2.77.0 2.78.0}
if [ "$#" -gt 0 ]; then
  versions="$*"
fi
case "${1:-}" in
  -h | --help)
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac

base_python=${REFRACT_PYTHON:-python3}
wheel=${REFRACT_WHEEL:-}
if [ -z "$wheel" ]; then
  wheel=$("$here/build-wheel.sh")
fi
echo "== wheel: $wheel"

# Test tools the smoke suite needs beside apache-beam and the wheel.
test_tools=(pytest==9.2.0 pytest-timeout==2.4.0 PyHamcrest==2.1.0)

results=()
failed=0
for version in $versions; do
  venv=$REFRACT_CACHE/beam-versions/$version
  log=$(mktemp -t "refract-beam-$version.XXXXXX")
  if [ "$version" = newest ]; then
    rm -rf "$venv"
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "== making $venv"
    "$base_python" -m venv "$venv"
    if [ "$version" != newest ]; then
      "$venv/bin/pip" install -q --disable-pip-version-check "apache-beam==$version" >>"$log" 2>&1 ||
        { cat "$log" >&2; echo "cannot install apache-beam==$version" >&2; exit 1; }
    fi
  fi
  # The wheel with its dependencies: pip checks that this apache-beam
  # meets what the wheel declares (and, for `newest`, picks one).
  # (The first install replaces a wheel of the same version built before.)
  if ! { "$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel" &&
    "$venv/bin/pip" install -q --disable-pip-version-check "$wheel" "${test_tools[@]}"; } >>"$log" 2>&1; then
    cat "$log" >&2
    echo "cannot install the wheel next to apache-beam $version" >&2
    exit 1
  fi
  installed=$("$venv/bin/python" -c 'import apache_beam; print(apache_beam.__version__)')
  echo "== apache-beam $installed ($version)"
  started=$(date +%s)
  rc=0
  (cd "$here/beam_versions" &&
    env -u REFRACT_BIN -u PYTHONPATH REFRACT_ROOT="$REFRACT_ROOT" \
      "$venv/bin/python" -m pytest -q -p no:cacheprovider --refract --timeout 300 \
      test_smoke.py) 2>&1 | tee "$log" || rc=$?
  summary=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$log" | tail -n 1 | tr -d '=' | sed 's/^ *//')
  results+=("$installed ($version): ${summary:-no summary} in $(($(date +%s) - started)) s")
  [ "$rc" -eq 0 ] || failed=1
  rm -f "$log"
done

echo
echo "== smoke suite per apache-beam version"
printf '%s\n' "${results[@]}"
exit "$failed"
