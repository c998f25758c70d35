"""A minimal toolgate client: stubs generated from proto/ at run time.

Executors run the tool with `normalized_arguments` from the response, never
with their own re-parse of the model's text: what was authorized and hashed
is exactly what runs.
"""

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import NamedTuple


class Stubs(NamedTuple):
    """The generated toolgate.v1 modules, for executors and approval UIs."""

    authorization: ModuleType  # AuthorizationService messages and the Decision enum
    authorization_grpc: ModuleType  # AuthorizationServiceStub
    common: ModuleType  # AuthContext, ErrorEnvelope, RiskLevel
    approval: ModuleType  # ApprovalService messages, ApprovalStatus and Verdict
    approval_grpc: ModuleType  # ApprovalServiceStub
    ledger: ModuleType  # LedgerService messages, BeginOutcome, CompletionStatus, ExecutionState
    ledger_grpc: ModuleType  # LedgerServiceStub


def load_stubs(proto_dir: str, out_dir: str) -> Stubs:
    """Generates the Python stubs for toolgate.v1 into out_dir and imports them.

    Unpacks in the order of `Stubs`:
    `pb, pb_grpc, common, approval_pb, approval_grpc, ledger_pb, ledger_grpc = load_stubs(...)`.
    """
    protos = sorted(str(p) for p in Path(proto_dir, "toolgate", "v1").glob("*.proto"))
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_dir}",
         f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *protos],
        check=True,
    )
    sys.path.insert(0, out_dir)
    from toolgate.v1 import (  # noqa: E402
        approval_pb2, approval_pb2_grpc, authorization_pb2, authorization_pb2_grpc, common_pb2, ledger_pb2,
        ledger_pb2_grpc)
    return Stubs(authorization_pb2, authorization_pb2_grpc, common_pb2, approval_pb2, approval_pb2_grpc,
                 ledger_pb2, ledger_pb2_grpc)


def default_addr() -> str:
    return os.environ.get("TOOLGATE_ADDR", "127.0.0.1:50051")
