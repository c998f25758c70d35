"""The generated toolgate.v1 modules, from the `toolgate` package.

The examples in this folder that speak the raw protocol (refund_example.py,
approver_example.py) take their stubs from here; executors should use the
SDK (`toolgate.Gate`, see sdk_example.py). Executors run the tool with
`normalized_arguments` from the response, never with their own re-parse of
the model's text: what was authorized and hashed is exactly what runs.
"""

import os
from types import ModuleType
from typing import NamedTuple

from toolgate.v1 import (approval_pb2, approval_pb2_grpc, authorization_pb2, authorization_pb2_grpc, common_pb2,
                         ledger_pb2, ledger_pb2_grpc)


class Stubs(NamedTuple):
    """The generated toolgate.v1 modules, for executors and approval UIs."""

    authorization: ModuleType  # AuthorizationService messages and the Decision enum
    authorization_grpc: ModuleType  # AuthorizationServiceStub
    common: ModuleType  # AuthContext, ErrorEnvelope, RiskLevel
    approval: ModuleType  # ApprovalService messages, ApprovalStatus and Verdict
    approval_grpc: ModuleType  # ApprovalServiceStub
    ledger: ModuleType  # LedgerService messages, BeginOutcome, CompletionStatus, ExecutionState
    ledger_grpc: ModuleType  # LedgerServiceStub


def load_stubs() -> Stubs:
    """The toolgate.v1 modules, in the order of `Stubs`:
    `pb, pb_grpc, common, approval_pb, approval_grpc, ledger_pb, ledger_grpc = load_stubs()`."""
    return Stubs(authorization_pb2, authorization_pb2_grpc, common_pb2, approval_pb2, approval_pb2_grpc,
                 ledger_pb2, ledger_pb2_grpc)


def default_addr() -> str:
    return os.environ.get("TOOLGATE_ADDR", "127.0.0.1:50051")
