#!/usr/bin/env bash
# The whole test suite, from a fresh clone: sets up what the tests need
# (a Python virtualenv with grpcio, grpcio-tools and rfc8785 for the Python
# executor test; the npm packages of clients/node, from its lock file, for
# the Node.js executor and gRPC-Web tests), then runs every Rust test (benches are compiled by clippy in
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

cargo test --locked "$@"
