"""Fixtures of the Python client tests: the `toolgate` package (its stubs
built from proto/) and connections to a real toolgate server.

pytest runs these tests from the Rust integration test
`python::the_python_executor_runs_the_refund_example`, which installs the
package from a clean copy of the tree, starts `toolgate serve` and sets
TOOLGATE_ADDR, TOOLGATE_REPO (the repository, for the conformance cases, the
protos and the packaging test) and three real identity tokens of tenant acme minted by it (Python holds no
signing key): TOOLGATE_APPROVER_TOKEN (dana, support_admin: may decide),
TOOLGATE_NON_APPROVER_TOKEN (erin, support_agent: may not) and
TOOLGATE_REQUESTER_TOKEN (bob, support_admin: the requester, so may not).
"""

import os

import grpc
import pytest

from toolgate_client import load_stubs


def required(name: str) -> str:
    """An environment variable the Rust test sets; a clear error without it."""
    value = os.environ.get(name)
    if value is None:
        pytest.fail(f"{name} is not set: these tests run from the Rust test "
                    "`python::the_python_executor_runs_the_refund_example` (./scripts/test.sh)", pytrace=False)
    return value


@pytest.fixture(scope="session")
def stubs():
    return load_stubs()


@pytest.fixture(scope="session")
def pb(stubs):
    return stubs.authorization


@pytest.fixture(scope="session")
def common(stubs):
    return stubs.common


@pytest.fixture(scope="session")
def apb(stubs):
    return stubs.approval


@pytest.fixture(scope="session")
def lpb(stubs):
    return stubs.ledger


@pytest.fixture(scope="session")
def addr():
    return required("TOOLGATE_ADDR")


@pytest.fixture(scope="session")
def channel(addr):
    with grpc.insecure_channel(addr) as ch:
        yield ch


@pytest.fixture(scope="session")
def stub(stubs, channel):
    return stubs.authorization_grpc.AuthorizationServiceStub(channel)


@pytest.fixture(scope="session")
def ledger(stubs, channel):
    return stubs.ledger_grpc.LedgerServiceStub(channel)


@pytest.fixture(scope="session")
def approvals(stubs, addr):
    """The approver is a different program on its own connection, with its own identity."""
    with grpc.insecure_channel(addr) as approver_channel:
        yield stubs.approval_grpc.ApprovalServiceStub(approver_channel)


@pytest.fixture(scope="session")
def approver_token():
    return required("TOOLGATE_APPROVER_TOKEN")


@pytest.fixture(scope="session")
def non_approver_token():
    return required("TOOLGATE_NON_APPROVER_TOKEN")


@pytest.fixture(scope="session")
def requester_token():
    return required("TOOLGATE_REQUESTER_TOKEN")


@pytest.fixture(scope="session")
def repo():
    from pathlib import Path
    return Path(required("TOOLGATE_REPO"))


@pytest.fixture
def gate(addr):
    """The executor's SDK connection."""
    from toolgate import Gate
    with Gate(addr) as g:
        yield g


@pytest.fixture
def approver_gate(addr, approver_token):
    """A second client, the approver, on its own connection with its own identity."""
    from toolgate import Gate, GateConfig
    with Gate(GateConfig(addr, identity_token=approver_token)) as g:
        yield g


@pytest.fixture
def async_gate(addr):
    """The executor's asyncio connection (opened on the loop that first uses it)."""
    from toolgate import AsyncGate
    return AsyncGate(addr)
