"""An approval UI in miniature: read a pending approval, show it, decide.

Every call carries the approver's identity token from the identity provider;
toolgate verifies it and takes the tenant from it, never from the request.
The verdict is bound to the `arguments_sha256` the approver was shown, so a
UI decides exactly what it displayed. Whether this person may decide is
toolgate's call (Cedar, `decide_approval`): nobody approves their own
request, nor another tenant's.

Run against a sidecar started with `cargo run --release -- serve` and a key set:

    TOOLGATE_IDENTITY_TOKEN=<approver token> \\
        python clients/python/approver_example.py APPROVAL_ID approve|reject "reason"
"""

import os
import sys

import grpc

from toolgate_client import default_addr, load_stubs


def review(stub, apb, identity_token: str, approval_id: str):
    """The approval, read as this approver; a bad token or an unknown id raises
    grpc.RpcError (UNAUTHENTICATED, NOT_FOUND)."""
    return stub.GetApproval(apb.GetApprovalRequest(
        identity_token=identity_token, approval_id=approval_id), timeout=5).approval


def show(approval, apb, common) -> str:
    """What the approver is shown: who asks, for which tool and risk, with the
    display arguments (sensitive values already redacted by toolgate)."""
    return "\n".join([
        f"approval {approval.approval_id} ({apb.ApprovalStatus.Name(approval.status)},"
        f" expires {approval.expires_at.ToJsonString()})",
        f"{approval.requester_subject_id} via {approval.agent_id} asks to run"
        f" {approval.tool} {approval.tool_version} ({common.RiskLevel.Name(approval.risk)})",
        f"arguments: {approval.display_arguments}",
    ])


def decide(stub, apb, identity_token: str, approval, approve: bool, reason: str):
    """Approves or rejects the approval as shown. A refusal (forbidden,
    approval_mismatch, approval_already_decided, approval_expired, ...) comes
    back in the response's `error`, not as a gRPC error."""
    return stub.DecideApproval(apb.DecideApprovalRequest(
        identity_token=identity_token,
        approval_id=approval.approval_id,
        verdict=apb.VERDICT_APPROVE if approve else apb.VERDICT_REJECT,
        arguments_sha256=approval.arguments_sha256,  # the hash of what was shown
        reason=reason,
    ), timeout=5)


def main(argv) -> int:
    if len(argv) != 3 or argv[1] not in ("approve", "reject"):
        print(__doc__)
        return 2
    approval_id, verdict, reason = argv
    token = os.environ["TOOLGATE_IDENTITY_TOKEN"]
    _, _, common, apb, apb_grpc, _, _ = load_stubs()
    with grpc.insecure_channel(default_addr()) as channel:
        stub = apb_grpc.ApprovalServiceStub(channel)
        approval = review(stub, apb, token, approval_id)
        print(show(approval, apb, common))
        r = decide(stub, apb, token, approval, verdict == "approve", reason)
    if r.HasField("error"):
        print("refused:", r.error.code, "-", r.error.message)
        return 1
    print("decided:", apb.ApprovalStatus.Name(r.approval.status), "by", r.approval.decided_by)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
