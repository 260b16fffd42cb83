#!/usr/bin/env bash
# Java workloads on Refract and on Prism, in one run, with the ratios.
#
#   integration/bench/java_bench.sh [BIN]
#
# Builds integration/java (Maven, repository cached in ~/.cache/refract/m2),
# starts `BIN serve` (default: the release build) and Prism (built once from
# the Go module proxy, see refract_prism_bin), and runs
# org.refract.bench.JavaBench's workloads — gbk, combine (1 s windows, summed
# per key), stateful (a value state and an event-time timer per key) — on
# each, with Java's PortableRunner and LOOPBACK workers, interleaved
# (every runner's first run, then every runner's second...). Each run must
# write the sum of its records; the time is from run() to
# waitUntilFinish() returning, printed by the pipeline.
#
# Knobs: REFRACT_BENCH_JAVA_RECORDS (2000000), REFRACT_BENCH_JAVA_KEYS
# (100000), REFRACT_BENCH_REPEATS (3), REFRACT_BENCH_JAVA_WORKLOADS
# (gbk,combine,stateful), REFRACT_BENCH_TIMEOUT (600 s per run).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../common.sh
. "$here/common.sh"

bin=$(refract_suite_binary "$0" "${1:-}")
records=${REFRACT_BENCH_JAVA_RECORDS:-2000000}
keys=${REFRACT_BENCH_JAVA_KEYS:-100000}
repeats=${REFRACT_BENCH_REPEATS:-3}
workloads=${REFRACT_BENCH_JAVA_WORKLOADS:-gbk,combine,stateful}
limit=${REFRACT_BENCH_TIMEOUT:-600}
expected=$((records * (records - 1) / 2))

classpath=$(refract_java_classpath)
prism=$(refract_prism_bin)
work=$(mktemp -d -t refract-java-bench.XXXXXX)
trap 'refract_stop_tracked; refract_kill_bounded' EXIT
trap 'exit 130' INT TERM

refract_port=$(refract_free_port)
refract_start_server "$bin" "$refract_port" "$work/refract.log"
REFRACT_TRACKED+=("$REFRACT_SERVER_PID")
refract_await_server "$refract_port" "$work/refract.log"
prism_port=$(refract_free_port)
refract_start_tracked "$prism_port" "$work/prism.log" 60 \
  "$prism" --job_port "$prism_port" --serve_http=false
runners=("Refract:$refract_port" "Prism:$prism_port")

echo "== Java workloads, $records records over $keys keys, $repeats runs each (logs: $work)" >&2
results=$work/results.txt
: >"$results"
IFS=, read -r -a names <<<"$workloads"
for workload in "${names[@]}"; do
  for run in $(seq 1 "$repeats"); do
    for runner in "${runners[@]}"; do
      name=${runner%%:*} port=${runner##*:}
      out=$work/$workload-$name-$run
      rc=0
      refract_run_bounded "$limit" java -cp "$classpath" org.refract.bench.JavaBench \
        --workload="$workload" --records="$records" --keys="$keys" --output="$out.txt" \
        --runner=PortableRunner --jobEndpoint="localhost:$port" \
        --defaultEnvironmentType=LOOPBACK >"$out.out" 2>"$out.log" || rc=$?
      # The pipeline prints its time on stdout; the SDK logs on stderr (one
      # file for both once cut the time's line in two).
      seconds=$(sed -n 's/^BENCH_JOB_SECONDS //p' "$out.out")
      got=$(cat "$out.txt" 2>/dev/null || echo missing)
      if [ "$rc" -ne 0 ] || [ -z "$seconds" ] || [ "$got" != "$expected" ]; then
        echo "== $workload on $name run $run FAILED (exit $rc, sum $got, want $expected)" >&2
        tail -n 20 "$out.out" "$out.log" >&2
        seconds=failed
      fi
      echo "== $workload $name run $run: $seconds s" >&2
      echo "$workload $name $seconds" >>"$results"
    done
  done
done

"$REFRACT_PY" - "$results" <<'PY'
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)
failed = set()
order = []
for line in open(sys.argv[1]):
  workload, runner, seconds = line.split()
  if workload not in order:
    order.append(workload)
  if seconds == 'failed':
    failed.add((workload, runner))
  else:
    runs[(workload, runner)].append(float(seconds))
print('| workload | Refract s | Prism s | Prism / Refract |')
print('|---|---|---|---|')
status = 0
for w in order:
  cells = []
  for r in ('Refract', 'Prism'):
    if (w, r) in failed or not runs[(w, r)]:
      cells.append(None)
      status = 1
    else:
      cells.append(statistics.median(runs[(w, r)]))
  ratio = '%.2fx' % (cells[1] / cells[0]) if all(cells) else '-'
  print('| %s | %s | %s | %s |' % (
      w, *['%.2f' % c if c else 'failed' for c in cells], ratio))
sys.exit(status)
PY
