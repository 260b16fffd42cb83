#!/usr/bin/env bash
# A key larger than the runner's memory budget, in the Java SDK: builds
# integration/java (Maven), runs its HotKey pipeline (96 MiB of values under
# one key, grouped, then counted) on Refract with a 16 MiB budget and LOOPBACK
# workers, and checks the count and bytes it wrote and that the runner handed
# the key out as a state-backed iterable (the Java harness pages through it
# over the state API). Exits non-zero otherwise.
#
#   integration/run-java-hot-key.sh
#
# Needs: java (17+), mvn, and a refract binary (REFRACT_BIN, or found as
# run-java-wordcount.sh finds one). Maven's repository cache is
# $REFRACT_CACHE/m2 (default ~/.cache/refract/m2).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"
cd "$REFRACT_ROOT"

refract_python_or_system

classpath=$(refract_java_classpath)

bin=$(refract_find_bin)
work=$(mktemp -d -t refract-java-hot.XXXXXX)
log=$work/refract.log
port=${REFRACT_JOB_PORT:-$(refract_free_port)}
refract_start_server "$bin" "$port" "$log" --memory_budget 16m --serve_http=false \
  --spill_dir "$work/spill"
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  refract_stop_server
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
refract_await_server "$port" "$log"

start=$SECONDS
rc=0
java -cp "$classpath" org.refract.examples.HotKey --output="$work/out.txt" \
  --runner=PortableRunner --jobEndpoint="localhost:$port" \
  --defaultEnvironmentType=LOOPBACK >"$work/hot.log" 2>&1 || rc=$?
echo "== HotKey: exit $rc after $((SECONDS - start))s" >&2
if [ "$rc" -ne 0 ]; then
  tail -n 40 "$work/hot.log" >&2
  tail -n 30 "$log" >&2
  exit "$rc"
fi
want="hot:1536:$((1536 * 65536))"
got=$(cat "$work/out.txt")
if [ "$got" != "$want" ]; then
  echo "== FAIL: HotKey wrote '$got', not '$want'" >&2
  exit 1
fi
if ! grep -q 'handed_out_keys=1' "$log"; then
  echo "== FAIL: the runner did not hand the key out:" >&2
  grep 'engine finished' "$log" >&2 || tail -n 30 "$log" >&2
  exit 1
fi
echo "== OK: $got, handed out as a state-backed iterable" >&2
