"""`GateConfig`: how a client reaches toolgate, in one value both clients
(`Gate`, `AsyncGate`) take. The defaults are the shared SDK semantics of
`clients/conformance/cases.json` (`sdk_semantics`), which the TypeScript
SDK follows too."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

_SERVICES = ("toolgate.v1.AuthorizationService", "toolgate.v1.LedgerService", "toolgate.v1.ApprovalService")


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of a call that never reached a server that processed it
    (gRPC status UNAVAILABLE only), as gRPC's retry policy (gRFC A6):
    `max_attempts` in all, the first included (1 turns retries off); the
    backoff starts at `initial_backoff` seconds and is multiplied by
    `backoff_multiplier` up to `max_backoff`.

    A ledger call retried after UNAVAILABLE is the same call (the ledger is
    keyed by the idempotency key), never a second run.
    """

    max_attempts: int = 3
    initial_backoff: float = 0.1
    max_backoff: float = 1.0
    backoff_multiplier: float = 2.0

    def service_config(self) -> str:
        """gRPC's service config (JSON) applying this policy to toolgate's services."""
        policy = {
            "maxAttempts": self.max_attempts,
            "initialBackoff": f"{self.initial_backoff:.3f}s",
            "maxBackoff": f"{self.max_backoff:.3f}s",
            "backoffMultiplier": self.backoff_multiplier,
            "retryableStatusCodes": ["UNAVAILABLE"],
        }
        return json.dumps({"methodConfig": [{"name": [{"service": s} for s in _SERVICES], "retryPolicy": policy}]})


def retry_service_config(max_attempts: int, initial_backoff: float, max_backoff: float,
                         backoff_multiplier: float) -> str:
    """gRPC's service config (gRFC A6) retrying UNAVAILABLE on toolgate's services."""
    return RetryPolicy(max_attempts, initial_backoff, max_backoff, backoff_multiplier).service_config()


@dataclass(frozen=True)
class GateConfig:
    """How to reach toolgate.

    `target` follows gRPC's naming: `host:port`, `dns:///host:port`,
    `unix:/path/to.sock`. TLS: `tls=True` with the system roots, or
    `root_certificates` (PEM bytes); mTLS adds `private_key` and
    `certificate_chain`; `server_name` overrides the name checked in the
    server's certificate. `timeout` is each call's deadline in seconds;
    `retry` the retries on UNAVAILABLE. `identity_token` is the caller's
    token for the approval calls. `in_progress_wait` is how long `run`
    waits, by default, while another executor holds the call (seconds).
    `options` are extra gRPC channel options.
    """

    target: str = "127.0.0.1:50051"
    tls: bool = False
    root_certificates: Optional[bytes] = None
    private_key: Optional[bytes] = None
    certificate_chain: Optional[bytes] = None
    server_name: Optional[str] = None
    timeout: float = 5.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    identity_token: str = ""
    in_progress_wait: float = 30.0
    options: Sequence[Tuple[str, Any]] = ()

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise ValueError("GateConfig.timeout must be positive (seconds)")
        if self.in_progress_wait < 0:
            raise ValueError("GateConfig.in_progress_wait must not be negative (seconds)")
        if self.retry.max_attempts < 1:
            raise ValueError("GateConfig.retry.max_attempts must be at least 1")

    @property
    def secure(self) -> bool:
        return bool(self.tls or self.root_certificates or self.private_key or self.certificate_chain)

    def channel_options(self) -> List[Tuple[str, Any]]:
        """The gRPC channel options this configuration means."""
        opts: List[Tuple[str, Any]] = list(self.options)
        if self.retry.max_attempts > 1:
            opts += [("grpc.enable_retries", 1), ("grpc.service_config", self.retry.service_config())]
        else:
            opts.append(("grpc.enable_retries", 0))
        if self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        if self.target.startswith(("unix:", "unix-abstract:")) and \
                not any(k == "grpc.default_authority" for k, _ in opts):
            # grpc-core's default authority for a socket path is not a valid
            # HTTP/2 :authority to toolgate's server, which resets the
            # stream; name it localhost, as the socket is.
            opts.append(("grpc.default_authority", "localhost"))
        return opts


def as_config(config: "GateConfig | str") -> GateConfig:
    """A target alone is the default configuration for that target."""
    return GateConfig(target=config) if isinstance(config, str) else config
