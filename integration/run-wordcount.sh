#!/usr/bin/env bash
# Quick start: a real Python word count on Refract, from a fresh machine.
#
#   integration/run-wordcount.sh [--top N] [--input FILE]
#
# Sets up (integration/setup.sh), builds the release binary, starts
# `refract serve --job_port <free port>` in the background, runs
# integration/wordcount/wordcount.py against it (PortableRunner, LOOPBACK
# workers) over the bundled text integration/wordcount/input.txt, prints the
# most common words, and stops the server.
#
# Environment knobs:
#   REFRACT_SKIP_CARGO=1  don't build; run $REFRACT_BIN instead
#   REFRACT_JOB_PORT      job port to use (default: a free one)
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"
cd "$REFRACT_ROOT"

"$here/setup.sh"

if [ "${REFRACT_SKIP_CARGO:-0}" = 1 ]; then
  bin=${REFRACT_BIN:?REFRACT_SKIP_CARGO=1 needs REFRACT_BIN}
else
  echo "== building refract (cargo build --release -p refract; the first build takes a while)" >&2
  cargo build --release -p refract
  bin=$CARGO_TARGET_DIR/release/refract
fi

port=${REFRACT_JOB_PORT:-$(refract_free_port)}
log=$(mktemp -t refract-serve.XXXXXX.log)
refract_start_server "$bin" "$port" "$log"
trap refract_stop_server EXIT
trap 'exit 130' INT TERM
refract_await_server "$port" "$log"

echo "== running the word count on localhost:$port" >&2
rc=0
"$REFRACT_PY" "$here/wordcount/wordcount.py" \
  --runner=PortableRunner --job_endpoint="localhost:$port" \
  --environment_type=LOOPBACK "$@" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "== the word count failed (exit $rc); last lines of the refract log:" >&2
  tail -n 50 "$log" >&2
fi
exit "$rc"
