"""The SDK's channels, checked by the Rust test
`python::the_python_sdk_connects_over_mutual_tls_and_a_unix_socket`:

    python transport_check.py TLS_ADDR CA_PEM CERT_PEM KEY_PEM UNIX_SOCKET

It prints one line per channel: what toolgate answered, or the gRPC status.
"""

import sys
from pathlib import Path

from toolgate import Auth, Gate, GateConfig, RetryPolicy, ToolgateError

READER = Auth("ann", "acme", scopes=["docs:read"])


def ask(gate: Gate) -> str:
    try:
        return gate.authorize("search_docs", '{"query":"refunds"}', READER).verdict.value
    except ToolgateError as failure:
        assert failure.grpc_status is not None and failure.code == failure.grpc_status.name.lower(), failure
        return failure.grpc_status.name


def main(tls_addr: str, ca: str, cert: str, key: str, socket: str) -> int:
    root, chain, private = (Path(p).read_bytes() for p in (ca, cert, key))
    once = RetryPolicy(max_attempts=1)
    with Gate(GateConfig(tls_addr, root_certificates=root, certificate_chain=chain, private_key=private,
                         server_name="localhost")) as gate:
        print("mtls:", ask(gate))
    with Gate(GateConfig(tls_addr, root_certificates=root, server_name="localhost", retry=once, timeout=3)) as gate:
        print("tls without a client certificate:", ask(gate))
    with Gate(GateConfig(tls_addr, retry=once, timeout=3)) as gate:
        print("plaintext to a TLS listener:", ask(gate))
    with Gate(f"unix:{socket}") as gate:
        print("unix:", ask(gate))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
