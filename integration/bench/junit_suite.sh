#!/usr/bin/env bash
# A user's JUnit suite of small TestPipelines on each runner a Beam Java
# user could pick for it, in one run.
#
#   integration/bench/junit_suite.sh [BIN]
#
# Runs integration/java's SmallPipelinesTest (profile suite-bench: Map,
# GroupByKey, Combine.perKey, a side input, Flatten, tagged outputs,
# windowed sums, each REFRACT_BENCH_JUNIT_REPEAT times, default 5) with
# Surefire once per runner, twice each, keeping the faster run:
#
#   DirectRunner                  Java's DirectRunner
#   Prism                         Beam's TestUniversalRunner, LOOPBACK,
#                                 against Prism (built once from the Go
#                                 module proxy, see refract_prism_bin)
#   TestRefractRunner             refract-runner's, strict mode (its default)
#   TestRefractRunner, not strict --refractStrict=false
#
# and prints each run's wall time (`mvn surefire:test`, the JVM's start
# included) and the median of the tests' own times (Surefire's report).
# BIN (default: the release build) is the refract the runner starts.
# Installs refract-runner first (integration/install-java-runner.sh).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../common.sh
. "$here/common.sh"
# shellcheck source=suite_runs.sh
. "$here/bench/suite_runs.sh"

bin=$(refract_suite_binary "$0" "${1:-}")
repeat=${REFRACT_BENCH_JUNIT_REPEAT:-5}
m2=$REFRACT_CACHE/m2
project=$here/java
work=$(mktemp -d -t refract-junit-bench.XXXXXX)
trap refract_stop_tracked EXIT
trap 'exit 130' INT TERM

"$here/install-java-runner.sh" -Dmaven.repo.local="$m2" -DskipTests >/dev/null
mvn -B -q -f "$project/pom.xml" -Dmaven.repo.local="$m2" -P suite-bench test-compile >&2

prism=$(refract_prism_bin)
prism_port=$(refract_free_port)
refract_start_tracked "$prism_port" "$work/prism.log" 60 \
  "$prism" --job_port "$prism_port" --serve_http=false

universal=org.apache.beam.runners.portability.testing.TestUniversalRunner
runners=(
  "DirectRunner|[\"--runner=DirectRunner\"]"
  "Prism|[\"--runner=$universal\",\"--jobEndpoint=localhost:$prism_port\",\"--defaultEnvironmentType=LOOPBACK\"]"
  "TestRefractRunner|[\"--runner=TestRefractRunner\",\"--refractLocation=$bin\"]"
  "TestRefractRunner, not strict|[\"--runner=TestRefractRunner\",\"--refractLocation=$bin\",\"--refractStrict=false\"]"
)

report=$project/target/surefire-reports/TEST-org.refract.bench.SmallPipelinesTest.xml
# junit_times LOG WALL: the tests, the wall time and the median test's
# milliseconds of the run just made (Surefire's report).
junit_times() {
  "$REFRACT_PY" - "$report" "$2" <<'PY'
import statistics
import sys
import xml.etree.ElementTree as ET
times = [float(c.get('time')) for c in ET.parse(sys.argv[1]).getroot().iter('testcase')]
print('%d %.1f %.0f' % (len(times), float(sys.argv[2]), statistics.median(times) * 1000))
PY
}

echo "| runner | tests | suite wall s | median ms per test | per test / DirectRunner |"
echo "|---|---:|---:|---:|---:|"
reference=
for entry in "${runners[@]}"; do
  name=${entry%%|*}
  options=${entry#*|}
  best=$(suite_best_of_two "$name" junit_times "$work/run.log" \
    mvn -B -q -f "$project/pom.xml" -Dmaven.repo.local="$m2" -P suite-bench \
    surefire:test -DbenchPipelineOptions="$options" -DbenchRepeat="$repeat")
  read -r _ _ median <<<"$best"
  reference=${reference:-$median}
  suite_row "$name" "$best" "$reference"
done
