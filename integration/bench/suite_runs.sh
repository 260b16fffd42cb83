# shellcheck shell=bash
# Helpers of the test-suite benchmarks (junit_suite.sh, ptest_suite.sh),
# sourced by them: each runs a suite twice per runner, keeps the faster run
# and prints a table row with the median per test beside the first row's.

# suite_best_of_two NAME PARSE LOG CMD...: runs CMD twice, its output in LOG,
# timing each run; PARSE LOG WALL prints "COUNT WALL MEDIAN_MS" for a run.
# Prints the faster run's line. Exits, showing the end of LOG, when CMD
# fails.
suite_best_of_two() {
  local name=$1 parse=$2 log=$3 best='' best_wall='' started wall line
  shift 3
  for _ in 1 2; do
    started=$(date +%s.%N)
    if ! "$@" >"$log" 2>&1; then
      tail -n 40 "$log" >&2
      echo "$(basename "$0"): the suite failed on $name" >&2
      exit 1
    fi
    wall=$(echo "$(date +%s.%N) - $started" | bc)
    line=$("$parse" "$log" "$wall")
    if [ -z "$best" ] || awk -v a="$wall" -v b="$best_wall" 'BEGIN { exit !(a < b) }'; then
      best=$line
      best_wall=$wall
    fi
  done
  echo "$best"
}

# suite_row NAME "COUNT WALL MEDIAN_MS" REFERENCE_MS: a Markdown table row,
# the median's ratio to REFERENCE_MS last.
suite_row() {
  local count wall median
  read -r count wall median <<<"$2"
  echo "$(basename "$0"): $1: $count runs, wall $wall s, median $median ms" >&2
  printf '| %s | %s | %s | %s | %.2fx |\n' "$1" "$count" "$wall" "$median" \
    "$(echo "$median / $3" | bc -l)"
}
