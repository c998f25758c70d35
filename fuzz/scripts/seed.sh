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
# The differential target starts from JSON-RPC envelopes (a tools/call, a
# tools/list) and JSONTestSuite too.
mkdir -p corpus/differential_envelope
cp "$suite"/*.json corpus/differential_envelope/
printf '%s' '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search_docs","arguments":{"query":"refund policy","limit":5}}}' > corpus/differential_envelope/tools_call.json
printf '%s' '{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"cursor":"c1"}}' > corpus/differential_envelope/tools_list.json
printf '%s' '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"refund_order","arguments":{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late","items":[{"sku":"a","qty":1}]},"_meta":{"toolgate/request_id":"r1"}}}' > corpus/differential_envelope/refund.json
echo "seeded $(ls corpus/differential_envelope | wc -l) files for differential_envelope"
