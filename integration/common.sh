# shellcheck shell=bash
# Paths shared by Refract's integration scripts. Source it; it runs nothing.
#
#   REFRACT_ROOT      the repository root (found from this file's location)
#   REFRACT_CACHE     caches kept outside the clone (default ~/.cache/refract)
#   REFRACT_VENV      the Python virtualenv made by setup.sh
#   REFRACT_PY        that virtualenv's python
#   CARGO_TARGET_DIR  exported; defaults to $REFRACT_CACHE/target so builds
#                     survive fresh clones (CI clones afresh on every run)

REFRACT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REFRACT_CACHE=${REFRACT_CACHE:-$HOME/.cache/refract}
REFRACT_VENV=${REFRACT_VENV:-$REFRACT_CACHE/venv}
REFRACT_PY=$REFRACT_VENV/bin/python
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REFRACT_CACHE/target}
export REFRACT_ROOT REFRACT_CACHE REFRACT_VENV REFRACT_PY CARGO_TARGET_DIR

# refract_free_port: prints a TCP port that is free on 127.0.0.1 right now.
refract_free_port() {
  "$REFRACT_PY" - <<'PY'
import socket
s = socket.socket()
s.bind(('127.0.0.1', 0))
print(s.getsockname()[1])
s.close()
PY
}

# refract_wait_for_port PORT PID [SECONDS]: waits until something accepts TCP
# connections on 127.0.0.1:PORT; fails early if process PID has exited.
refract_wait_for_port() {
  local port=$1 pid=$2 limit=${3:-60} waited=0
  while ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "refract (pid $pid) exited before listening on port $port" >&2
      return 1
    fi
    if [ "$waited" -ge $((limit * 10)) ]; then
      echo "refract did not listen on port $port within ${limit}s" >&2
      return 1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
}

# refract_python_or_system: points REFRACT_PY at the system's python3 when
# setup.sh's virtualenv is missing: refract_free_port needs a Python, and the
# Java scripts should not need the virtualenv.
refract_python_or_system() {
  if [ ! -x "$REFRACT_PY" ]; then
    REFRACT_PY=$(command -v python3)
  fi
}

# refract_find_bin: prints the refract binary to test: $REFRACT_BIN, else the
# release build in $CARGO_TARGET_DIR, else the debug build (built if missing).
refract_find_bin() {
  if [ -n "${REFRACT_BIN:-}" ]; then
    echo "$REFRACT_BIN"
  elif [ -x "$CARGO_TARGET_DIR/release/refract" ]; then
    echo "$CARGO_TARGET_DIR/release/refract"
  else
    echo "== building refract (cargo build -p refract)" >&2
    cargo build -p refract >&2
    echo "$CARGO_TARGET_DIR/debug/refract"
  fi
}

# refract_suite_binary SCRIPT [BIN]: prints, as an absolute path, the refract
# binary a suite script tests: BIN, else $REFRACT_BIN, else the release
# build. Fails, naming SCRIPT, when that is not an executable.
refract_suite_binary() {
  local bin=${2:-${REFRACT_BIN:-$CARGO_TARGET_DIR/release/refract}}
  if [ ! -x "$bin" ]; then
    echo "$1: no executable refract binary at $bin" >&2
    return 1
  fi
  realpath "$bin"
}

# refract_start_server BIN PORT LOG [FLAG...]: starts `BIN serve --job_port PORT
# FLAG...` in the background with its output in LOG, and sets
# REFRACT_SERVER_PID (for the caller's EXIT trap, to be set before
# refract_await_server).
REFRACT_SERVER_PID=
refract_start_server() {
  echo "== starting: $1 serve --job_port $2 ${*:4} (log: $3)" >&2
  "$1" serve --job_port "$2" "${@:4}" </dev/null >"$3" 2>&1 &
  REFRACT_SERVER_PID=$!
}

# refract_await_server PORT LOG: waits up to 60 s for the server started by
# refract_start_server to listen on PORT; on failure shows LOG's tail, fails.
refract_await_server() {
  if ! refract_wait_for_port "$1" "$REFRACT_SERVER_PID" 60; then
    tail -n 50 "$2" >&2
    return 1
  fi
}

# refract_stop_server: stops (TERM) and waits for the server started by
# refract_start_server; for the caller's EXIT trap.
refract_stop_server() {
  kill "$REFRACT_SERVER_PID" 2>/dev/null || true
  wait "$REFRACT_SERVER_PID" 2>/dev/null || true
}

# refract_run_bounded SECONDS COMMAND...: runs COMMAND under timeout(1), which
# gives it a process group of its own, with stdin from /dev/null. When it has
# ended, whatever is left of that group (say, a runner started by a killed
# test) is ended too. Returns COMMAND's status; 124 means it ran out of time.
# Scripts should `trap 'refract_kill_bounded; exit 130' INT TERM`.
_refract_bounded_pid=
refract_run_bounded() {
  local limit=$1 rc=0
  shift
  timeout -k 30 "$limit" "$@" </dev/null &
  _refract_bounded_pid=$!
  wait "$_refract_bounded_pid" || rc=$?
  refract_kill_bounded
  if [ "$rc" -eq 124 ]; then
    echo "refract: '$1' ran out of time after ${limit}s and was killed" >&2
  fi
  return "$rc"
}

refract_kill_bounded() {
  if [ -n "$_refract_bounded_pid" ]; then
    kill -TERM -- "-$_refract_bounded_pid" 2>/dev/null || true
    _refract_bounded_pid=
  fi
}

# refract_java_classpath: builds integration/java (`mvn -q package`, Maven's
# repository cached in $REFRACT_CACHE/m2, the first build downloads Beam) and
# prints the runtime classpath of its pipelines.
refract_java_classpath() {
  local m2=$REFRACT_CACHE/m2 project=$REFRACT_ROOT/integration/java start=$SECONDS
  mkdir -p "$m2"
  echo "== building integration/java (mvn -q package)" >&2
  mvn -B -q -f "$project/pom.xml" -Dmaven.repo.local="$m2" package >&2
  echo "== maven build took $((SECONDS - start))s" >&2
  echo "$project/target/classes:$(cat "$project/target/classpath.txt")"
}

# refract_prism_bin: prints the path of Prism, Beam's Go runner, built once
# from the Go module proxy (`go install ...@$REFRACT_PRISM_VERSION`) into
# $REFRACT_CACHE/prism/VERSION/. Tests run on it as the reference runner, for
# instance the cross-language ones, which need a runner that already resolves
# the expansion service's AnyOf environments. Python's PrismRunner would
# download a release binary from GitHub, which these machines cannot reach.
# Beam's Go module needs Go 1.26 or newer.
REFRACT_PRISM_VERSION=${REFRACT_PRISM_VERSION:-v2.78.0}
refract_prism_bin() {
  local dir=$REFRACT_CACHE/prism/$REFRACT_PRISM_VERSION start=$SECONDS
  if [ ! -x "$dir/prism" ]; then
    refract_need_go refract_prism_bin || return 1
    echo "== building Prism $REFRACT_PRISM_VERSION (go install, once)" >&2
    rm -rf "$dir/tmp"
    mkdir -p "$dir/tmp"
    # `go install pkg@version` builds outside any module, so nothing needs a
    # go.mod of ours; the module and build caches are the ones the OTLP
    # test's collector build uses. GOFLAGS is set whole because -mod=... is
    # refused in this mode. GOTOOLCHAIN=auto lets a Go older than the
    # module asks for fetch the newer toolchain from the module proxy.
    GOBIN=$dir/tmp GOMODCACHE=$REFRACT_CACHE/go-mod \
      GOCACHE=$REFRACT_CACHE/go-build GOFLAGS=-buildvcs=false \
      GOTOOLCHAIN=${GOTOOLCHAIN:-auto} \
      go install -trimpath \
      "github.com/apache/beam/sdks/v2/go/cmd/prism@$REFRACT_PRISM_VERSION" >&2
    mv "$dir/tmp/prism" "$dir/prism"
    rmdir "$dir/tmp"
    echo "== Prism build took $((SECONDS - start))s" >&2
  fi
  echo "$dir/prism"
}

# _refract_go ARGS...: runs `go ARGS` with the module and build caches
# under $REFRACT_CACHE (shared by every Go build of the scripts). GOFLAGS
# (default -buildvcs=false) is set whole because `go install pkg@version`
# refuses -mod=...;
# GOTOOLCHAIN=auto lets a Go older than a module asks for fetch the newer
# toolchain from the module proxy.
# refract_need_go WHO: fails, saying WHO needs it, unless `go` is on PATH.
refract_need_go() {
  if ! command -v go >/dev/null 2>&1; then
    echo "$1: needs Go (1.26 or newer) on PATH" >&2
    return 1
  fi
}

_refract_go() {
  GOMODCACHE=$REFRACT_CACHE/go-mod GOCACHE=$REFRACT_CACHE/go-build \
    GOFLAGS=${GOFLAGS:--buildvcs=false} GOTOOLCHAIN=${GOTOOLCHAIN:-auto} go "$@"
}

# refract_stop_tracked: stops (TERM) and waits for every background process
# whose pid a script appended to REFRACT_TRACKED; for its EXIT trap.
REFRACT_TRACKED=()
refract_stop_tracked() {
  local pid
  for pid in "${REFRACT_TRACKED[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${REFRACT_TRACKED[@]}"; do wait "$pid" 2>/dev/null || true; done
}

# refract_start_tracked PORT LOG SECONDS COMMAND...: starts COMMAND, which is
# to listen on 127.0.0.1:PORT, in the background (stdin from /dev/null,
# output in LOG), appends its pid to REFRACT_TRACKED and waits up to SECONDS
# for it to listen; fails if it does not.
refract_start_tracked() {
  local port=$1 log=$2 limit=$3
  shift 3
  "$@" </dev/null >"$log" 2>&1 &
  REFRACT_TRACKED+=("$!")
  refract_wait_for_port "$port" "$!" "$limit"
}

# refract_go_wordcount_bin: builds the Go pipeline integration/go/wordcount
# (its go.mod and go.sum pin Beam's Go SDK) into $REFRACT_CACHE/go-bin and
# prints its path. Go's build cache makes a rebuild of unchanged sources a
# matter of seconds.
refract_go_wordcount_bin() {
  local out=$REFRACT_CACHE/go-bin
  refract_need_go refract_go_wordcount_bin || return 1
  mkdir -p "$out"
  (cd "$REFRACT_ROOT/integration/go/wordcount" &&
    _refract_go build -trimpath -o "$out/wordcount" .) >&2
  echo "$out/wordcount"
}

# refract_go_boot_bin: prints the path of the boot program of Beam's Go SDK
# image (`go/container` at $REFRACT_PRISM_VERSION), built once. As a PROCESS
# environment's command it fetches the job's staged pipeline binary and
# runs it in worker mode, as inside the image.
refract_go_boot_bin() {
  local dir=$REFRACT_CACHE/go-boot/$REFRACT_PRISM_VERSION
  if [ ! -x "$dir/container" ]; then
    rm -rf "$dir/tmp"
    mkdir -p "$dir/tmp"
    GOBIN=$dir/tmp _refract_go install -trimpath \
      "github.com/apache/beam/sdks/v2/go/container@$REFRACT_PRISM_VERSION" >&2
    mv "$dir/tmp/container" "$dir/container"
    rmdir "$dir/tmp"
  fi
  echo "$dir/container"
}

# _refract_maven_classpath DIR [JAR]: builds the Maven project in DIR (a
# pom that writes target/classpath.txt, see integration/xlang,
# integration/kafka and integration/sql-expansion) with the repository
# cached in $REFRACT_CACHE/m2, and prints that classpath, preceded by the
# project's own target/JAR when it builds one. Maven itself is run only when
# the pom, the sources or the cache location changed or a listed jar is
# gone: even a warm `mvn package` costs seconds, and the tests ask for these
# classpaths at every session start.
_refract_maven_classpath() {
  local project=$1 own=${2:+$1/target/$2} m2=$REFRACT_CACHE/m2 start=$SECONDS key jar fresh=1
  local out=$project/target/classpath.txt stamp=$project/target/classpath.key
  key=$({
    cat "$project/pom.xml"
    echo "$m2"
    if [ -d "$project/src" ]; then
      find "$project/src" -type f | LC_ALL=C sort | xargs cat
    fi
  } | sha256sum | cut -c1-16)
  if [ -f "$out" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then
    while IFS= read -r jar; do
      [ -f "$jar" ] || fresh=0
    done < <({ [ -z "$own" ] || echo "$own"; tr ':' '\n' <"$out"; })
  else
    fresh=0
  fi
  if [ "$fresh" -eq 0 ]; then
    mkdir -p "$m2"
    echo "== building ${project#"$REFRACT_ROOT"/} (mvn -q package)" >&2
    rm -f "$stamp"
    mvn -B -q -f "$project/pom.xml" -Dmaven.repo.local="$m2" package >&2
    echo "$key" >"$stamp"
    echo "== maven took $((SECONDS - start))s" >&2
  fi
  echo "${own:+$own:}$(cat "$out")"
}

# refract_xlang_classpath: prints the classpath of a Java expansion service
# with KafkaIO (integration/xlang/pom.xml; Beam 2.73.0), resolved once.
# Start it with: java -cp CP org.apache.beam.sdk.expansion.service.ExpansionService
# PORT --alsoStartLoopbackWorker
refract_xlang_classpath() {
  _refract_maven_classpath "$REFRACT_ROOT/integration/xlang"
}

# refract_kafka_classpath: prints the classpath of a Kafka broker
# (integration/kafka/pom.xml; kafka_2.13 4.4.0, run as kafka.Kafka), resolved
# once.
refract_kafka_classpath() {
  _refract_maven_classpath "$REFRACT_ROOT/integration/kafka"
}

# refract_sql_classpath: prints the classpath of integration/sql-expansion
# (a Beam 2.65.0 expansion service that registers SqlTransform; Beam's own
# SQL expansion jar is not served here), its own jar first, built once per
# change. Start it like the Java expansion service above.
refract_sql_classpath() {
  _refract_maven_classpath "$REFRACT_ROOT/integration/sql-expansion" \
    refract-sql-expansion-service-0.1.0.jar
}
