#!/usr/bin/env bash
# Installs org.refract:refract-runner:0.1.0 (integration/java/refract-runner:
# RefractRunner and TestRefractRunner for Beam Java pipelines) into the local
# Maven repository, after its tests ran on a real refract binary.
#
#   integration/install-java-runner.sh [mvn args, e.g. -Dmaven.repo.local=DIR or -DskipTests]
#
# The tests run on $REFRACT_BIN, else the release build in $CARGO_TARGET_DIR,
# else what the runner itself finds (refract on PATH, then the refract-beam
# wheel's). Prints the installed jar's path. About 20 s with Maven's cache
# warm.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

bin=${REFRACT_BIN:-}
if [ -z "$bin" ] && [ -x "$CARGO_TARGET_DIR/release/refract" ]; then
  bin=$CARGO_TARGET_DIR/release/refract
fi
project=$here/java/refract-runner
echo "== mvn install (integration/java/refract-runner)${bin:+, tests on $bin}" >&2
mvn -B -q -f "$project/pom.xml" ${bin:+"-DrefractLocation=$bin"} "$@" install >&2
repo=$HOME/.m2/repository
for arg in "$@"; do
  case $arg in -Dmaven.repo.local=*) repo=${arg#-Dmaven.repo.local=} ;; esac
done
echo "$repo/org/refract/refract-runner/0.1.0/refract-runner-0.1.0.jar"
