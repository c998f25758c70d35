"""toolgate's executor SDK: ask toolgate before a tool runs, and run it once.

    from toolgate import Auth, Gate

    with Gate("127.0.0.1:50051") as gate:
        outcome = gate.run("refund_order", model_arguments, Auth("bob", "acme"), "refund-ord_1001-1", refund)
        reply_to_model = outcome.model_output

`AsyncGate` is the same client on asyncio (grpc.aio); both take a
`GateConfig`. Every public call answers typed values (`Decision`,
`RunResult`, `Approval`, …) or raises `ToolgateError`. The generated gRPC
messages and stubs are `toolgate.v1` (built from proto/toolgate/v1 when the
package is built); the public API does not return them.
"""

from toolgate._aio import AsyncGate
from toolgate._config import GateConfig, RetryPolicy, retry_service_config
from toolgate._core import ReconcileFn, ToolFn
from toolgate._gate import Gate
from toolgate._types import (Approval, ApprovalPage, ApprovalState, Auth, Deadline, Decision, ErrorInfo, Execution,
                             Reconciled, RunResult, RunStatus, ToolError, ToolgateError, ToolInfo, Verdict)

__all__ = [
    "Approval", "ApprovalPage", "ApprovalState", "AsyncGate", "Auth", "Deadline", "Decision", "ErrorInfo",
    "Execution", "Gate", "GateConfig", "ReconcileFn", "Reconciled", "RetryPolicy", "RunResult", "RunStatus",
    "ToolError", "ToolFn", "ToolInfo", "ToolgateError", "Verdict", "retry_service_config",
]
