"""An executor process for the crash test (test_sdk_run.py):

    python sdk_executor_process.py ADDR REQUEST_ID crash|late|resume EFFECTS_FILE

`crash` runs the small refund with a 1.5 s lease; its tool makes the refund
(one line in EFFECTS_FILE, the provider's record) and then hangs until the
test kills the process, between begin and complete. `late` does the same
with a 1 s lease, and prints how `run` ended (the test stops the process
until someone else has settled the call). `resume` runs the same
operation until it is settled, reconciling against EFFECTS_FILE, and prints
what it saw as JSON.
"""

import json
import sys
import threading
import time
from pathlib import Path

from toolgate import Auth, Gate, Reconciled, RunStatus

from refund_example import ENTITIES

BOB = Auth("bob", "acme", ["support_agent"], ["orders:read", "orders:refund"], agent_id="support-bot")
SMALL = '{"order_id": "ord_1001", "amount_cents": 2500, "currency": "USD", "reason": "late"}'


def main(addr: str, request_id: str, mode: str, effects: Path) -> int:
    def refund(arguments, key, deadline):
        if mode not in ("crash", "late"):
            raise AssertionError("the resuming executor must never run the refund")
        record = {"key": key, "result": {"refund_id": "re_crash", "amount_cents": arguments["amount_cents"]}}
        with effects.open("a") as f:
            f.write(json.dumps(record) + "\n")
        threading.Event().wait()  # hangs here until killed

    def find(key, arguments):
        for line in effects.read_text().splitlines():
            record = json.loads(line)
            if record["key"] == key:
                return Reconciled(True, record["result"])
        return Reconciled(False)

    with Gate(addr) as gate:
        if mode == "crash":
            gate.run("refund_order", SMALL, BOB, request_id, refund, entities_json=ENTITIES, lease_ms=1500)
            return 1  # never reached: the tool hangs
        if mode == "late":
            out = gate.run("refund_order", SMALL, BOB, request_id, refund, entities_json=ENTITIES, lease_ms=1000)
            print(json.dumps({"status": out.status.value, "code": out.error.code if out.error else ""}))
            return 0
        saw = []
        stop = time.monotonic() + 20
        while time.monotonic() < stop:
            # wait=0: answer IN_PROGRESS at once (this loop shows each answer) instead of waiting 30 s.
            out = gate.run("refund_order", SMALL, BOB, request_id, refund, entities_json=ENTITIES, reconcile=find,
                           wait=0)
            saw.append(out.status.value)
            if out.status is not RunStatus.IN_PROGRESS:
                print(json.dumps({"saw": saw, "status": out.status.value, "result": out.result}))
                return 0
            time.sleep(out.retry_after_ms / 1000)
        print(json.dumps({"saw": saw, "status": "timed out"}))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
