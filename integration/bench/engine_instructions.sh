#!/usr/bin/env bash
# Counts the engine's work: the instructions of one run of each criterion
# benchmark of refract-engine under valgrind's callgrind, in all (every
# thread, the benchmark's setup included, which is the same on two
# commits) and in the run itself (the bench's `run_with`, inclusive: the
# engine's loop on the main thread). Unlike wall time, which moves by 5-10%
# between runs of one binary on a shared 2-vCPU VM, the counts repeat to a
# few hundredths of a percent on an idle machine, so a change to the engine
# is compared by running this on both commits. Run it on an idle machine:
# under load the runtime's threads poll differently and the counts move.
# A rebuild alone can move them by about 1% (the compiler's codegen units
# are split differently, and with them what is inlined). About 2 minutes
# (the build aside).
#
#   integration/bench/engine_instructions.sh              # every benchmark
#   integration/bench/engine_instructions.sh gbk_streaming # those matching
#
# Needs valgrind (apt-get install valgrind).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=../common.sh
. integration/common.sh

if ! command -v valgrind >/dev/null || ! command -v callgrind_annotate >/dev/null; then
  echo "engine_instructions.sh: needs valgrind and callgrind_annotate (apt-get install valgrind)" >&2
  exit 2
fi

bin=$(
  cargo bench --no-run -p refract-engine --bench engine --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
  m = json.loads(line)
  if m.get("reason") == "compiler-artifact" and m.get("executable") and "engine" == m["target"]["name"]:
    print(m["executable"])
'
)
if [ -z "$bin" ]; then
  echo "engine_instructions.sh: cannot build the engine benchmark" >&2
  exit 1
fi

if [ "$#" -eq 0 ]; then
  set -- gbk_100000_elements/1000_keys gbk_100000_elements/100000_keys gbk_streaming \
    flatten_x3 sdk_identity_x3 timers_
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-36s %16s %16s\n' benchmark 'in all' 'in the run'
for filter in "$@"; do
  file="$out/callgrind.out"
  # Under callgrind a second of profiling is one run of the benchmark.
  (cd runner/engine && valgrind --tool=callgrind --callgrind-out-file="$file" \
    "$bin" --bench "$filter" --profile-time 1 >/dev/null 2>&1)
  annotated=$(callgrind_annotate --inclusive=yes "$file" 2>/dev/null)
  total=$(awk '/PROGRAM TOTALS/ && !found { print $1; found = 1 }' <<<"$annotated")
  run=$(awk '/engine::run_with \[/ && !found { print $1; found = 1 }' <<<"$annotated")
  printf '%-36s %16s %16s\n' "$filter" "${total:-?}" "${run:-?}"
done
