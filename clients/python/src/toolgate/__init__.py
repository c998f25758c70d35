"""toolgate's executor SDK: ask toolgate before a tool runs, and run it once.

    from toolgate import Auth, Gate

    with Gate("127.0.0.1:50051") as gate:
        outcome = gate.run("refund_order", model_arguments, Auth("bob", "acme"), "refund-ord_1001-1", refund)
        reply_to_model = outcome.model_output

The generated gRPC messages and stubs are `toolgate.v1` (built from
proto/toolgate/v1 when the package is built).
"""

from toolgate._gate import Gate, ReconcileFn, ToolFn, retry_service_config
from toolgate._types import (ApprovalState, ApprovalTimeout, Auth, Deadline, Decision, ErrorInfo, GateError,
                             Reconciled, RunResult, RunStatus, ToolError, Verdict, approval_state)

__all__ = [
    "ApprovalState", "ApprovalTimeout", "Auth", "Deadline", "Decision", "ErrorInfo", "Gate", "GateError",
    "ReconcileFn", "Reconciled", "RunResult", "RunStatus", "ToolError", "ToolFn", "Verdict", "approval_state",
    "retry_service_config",
]
