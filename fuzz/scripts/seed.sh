#!/usr/bin/env bash
# Seeds the fuzz corpus with JSONTestSuite's parsing cases, copied at run
# time from the conformance folder (never committed).
set -euo pipefail
cd "$(dirname "$0")/.."
suite="${TOOLGATE_CONFORMANCE_DIR:-../../shared/conformance}/JSONTestSuite/test_parsing"
[ -d "$suite" ] || { echo "no JSONTestSuite at $suite" >&2; exit 1; }
mkdir -p corpus/decode_arguments
cp "$suite"/*.json corpus/decode_arguments/
echo "seeded $(ls corpus/decode_arguments | wc -l) files from $suite"
