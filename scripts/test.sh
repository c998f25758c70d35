#!/usr/bin/env bash
# The whole test suite, from a fresh clone: sets up what the tests need
# (a Python virtualenv with grpcio, grpcio-tools and rfc8785 for the Python
# executor test; the npm packages of clients/node, from its lock file, for
# the Node.js executor and gRPC-Web tests; the PostgreSQL server of the
# machine for the PostgreSQL store tests), then runs every Rust test (benches are compiled by clippy in
# .ci/run, never run here). Extra arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r clients/python/requirements.txt
export TOOLGATE_PYTHON="$PWD/$venv/bin/python"

(cd clients/node && npm ci --no-audit --no-fund --loglevel=error)

# PostgreSQL for the store suite, the replicas and the outage test: the
# machine's server on 127.0.0.1:5432 (started if it was stopped), or the
# server TOOLGATE_TEST_POSTGRES names. Under CI=true the tests fail, never
# skip, when it does not answer.
export TOOLGATE_TEST_POSTGRES="${TOOLGATE_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}"
if [ "$TOOLGATE_TEST_POSTGRES" = "postgres://postgres@127.0.0.1:5432/test" ] \
  && ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null \
  && command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
  for version in $(ls /etc/postgresql); do
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  done
  for _ in $(seq 1 30); do
    pg_isready -q -h 127.0.0.1 -p 5432 && break
    sleep 1
  done
fi

cargo test --locked "$@"
