#!/usr/bin/env bash
# Runs Beam's shared portable-runner test cases against refract with none of
# Prism's opt-outs (integration/beam_suite/refract_runner_test.py): custom
# window coders, custom merging windows and the drain cases included.
#
#   integration/refract_suite.sh [BIN] [extra pytest args, e.g. -k drain]
#
# BIN defaults to $REFRACT_BIN, then $CARGO_TARGET_DIR/release/refract.
# Fails when any test fails, hits the per-test timeout or crashes the
# runner, or when fewer tests pass than integration/refract_suite_bar.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

bin=$(refract_suite_binary refract_suite.sh "${1:-}")
if [ "$#" -gt 0 ]; then shift; fi
bar=$(tr -d '[:space:]' <"$here/refract_suite_bar")
report_dir=${REFRACT_REPORT_DIR:-$(mktemp -d -t refract-suite.XXXXXX)}
mkdir -p "$report_dir"

echo "== RefractRunnerTest against $bin (bar: $bar passed, none failed; reports: $report_dir)"
trap 'refract_kill_bounded; exit 130' INT TERM
cd "$here/beam_suite"
rc=0
REFRACT_BIN=$bin PYTHONPATH="$here/beam_suite${PYTHONPATH:+:$PYTHONPATH}" \
  REFRACT_SUITE_EVENTS="$report_dir/events.json" \
  refract_run_bounded 1500 \
  "$REFRACT_PY" -m pytest \
  -p refract_beam_plugin -p no:cacheprovider -c "$here/beam_suite/pytest.ini" \
  refract_runner_test.py \
  --timeout 120 --timeout-method=signal --session-timeout 1200 \
  --junitxml "$report_dir/junit.xml" \
  -v --tb=native --show-capture=no -rfE --disable-warnings \
  "$@" || rc=$?

"$REFRACT_PY" "$here/beam_suite/summarize.py" \
  --junit "$report_dir/junit.xml" --events "$report_dir/events.json" \
  --bar "$bar" --all-must-pass --pytest-exit "$rc" --label refract-suite \
  ${REFRACT_RECORD:+--record "$REFRACT_RECORD"}
