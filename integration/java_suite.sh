#!/usr/bin/env bash
# Beam's Java ValidatesRunner suite (from beam-sdks-java-core's test jar) on
# Refract: starts `refract serve`, runs the `validates-runner` profile of
# integration/java (Surefire, TestUniversalRunner, LOOPBACK workers inside the
# test JVM) against it, and prints the pass/fail counts from Surefire's reports.
#
#   integration/java_suite.sh [-Dtest=PATTERN] [other Maven options...]
#
# e.g. integration/java_suite.sh -Dtest='ParDoTest*'
#
# Environment knobs:
#   REFRACT_BIN          the refract binary (default: the release build in
#                        $CARGO_TARGET_DIR, else the debug one)
#   REFRACT_JOB_PORT     job port to use (default: a free one)
#   REFRACT_JAVA_SUITE_TIMEOUT  seconds for the whole Maven run (default 5400)
# Exit status: Maven's (non-zero when a test failed or the run timed out).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"
cd "$REFRACT_ROOT"

refract_python_or_system

bin=$(refract_find_bin)

m2=$REFRACT_CACHE/m2
mkdir -p "$m2"
project=$here/java
reports=$project/target/surefire-reports
rm -rf "$reports"

log=$(mktemp -t refract-java-suite.XXXXXX.log)
port=${REFRACT_JOB_PORT:-$(refract_free_port)}
refract_start_server "$bin" "$port" "$log"
# shellcheck disable=SC2317 # called by the EXIT trap
stop_server() {
  refract_kill_bounded
  refract_stop_server
}
trap stop_server EXIT
trap 'exit 130' INT TERM
refract_await_server "$port" "$log"

# Which tests: every test class of the test jar, nested classes too (Surefire
# skips `Outer$Inner` classes by default, and most of ParDoTest, MetricsTest
# and GroupByKeyTest are nested), less the tests that cannot finish on
# Refract (each is counted as failed in docs/compatibility.md, with its cause).
# A -Dtest=… given on the command line replaces this.
tests='*Test,*Test$*,*Tests,!ViewTest#testTriggeredLatestSingleton'
for arg in "$@"; do
  case $arg in -Dtest=*) tests= ;; esac
done

rc=0
refract_run_bounded "${REFRACT_JAVA_SUITE_TIMEOUT:-5400}" \
  mvn -B -f "$project/pom.xml" -Dmaven.repo.local="$m2" -P validates-runner \
  -DjobPort="$port" ${tests:+"-Dtest=$tests"} "$@" test || rc=$?

# Surefire prints its totals only when it finishes; count the per-class
# reports instead, so a run that timed out still says how far it got.
if [ -d "$reports" ]; then
  "$REFRACT_PY" - "$reports" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
tests = failed = errors = skipped = 0
for path in glob.glob(sys.argv[1] + "/TEST-*.xml"):
    suite = ET.parse(path).getroot()
    tests += int(suite.get("tests", 0))
    failed += int(suite.get("failures", 0))
    errors += int(suite.get("errors", 0))
    skipped += int(suite.get("skipped", 0))
passed = tests - failed - errors - skipped
print(f"java ValidatesRunner: {passed} passed, {failed + errors} failed, {skipped} skipped")
PY
fi

# The same run per JUnit category (with the tests excluded by category), as
# docs/compatibility.md records it; also written to target/categories.md.
classpath_file=$project/target/vr-classpath.txt
if [ -d "$reports" ] && [ -f "$classpath_file" ]; then
  test_jar=$(tr ':' '\n' <"$classpath_file" | grep -- '-tests\.jar$' | head -n 1)
  excluded=$(sed -n 's:.*<vrExcludedGroups>\(.*\)</vrExcludedGroups>.*:\1:p' "$project/pom.xml")
  if java -cp "$project/target/classes:$(cat "$classpath_file")" \
    org.refract.tools.CategoryReport "$test_jar" "$reports" "$excluded" \
    >"$project/target/categories.md"; then
    cat "$project/target/categories.md"
  fi
fi
exit "$rc"
