//! Who may call which service (DESIGN §9): the transport identity of a
//! connection, and the grants that map it to the services it may call.
//!
//! An agent executor that can reach `DecideApproval` can approve its own
//! calls, so the approval UI and the executor get separate grants. The
//! identity comes from the transport only — a client certificate's subject
//! CN or SAN (DNS or URI, e.g. a SPIFFE id), or a Unix peer's uid — never
//! from a request field. This module holds the rules; `listener/` reads the
//! identity off the connection and enforces them in one layer.
//!
//! A grant also names the tenants its caller may act for ([`TenantScope`]):
//! an executor of one tenant that sends another tenant's id is refused,
//! whatever roles it claims. The layer hands the scope to the desks, which
//! check it against the tenant the request runs as (the principal, after
//! any identity token is verified), not against a field as sent.

mod browser;
mod limits;
mod peer;
mod tenants;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

pub use browser::{BrowserRefusal, Transport, admits_http1};
pub use limits::ListenerLimits;
pub use peer::{CallerPattern, PeerIdentity};
pub use tenants::{ReconcileScope, TenantScope};

/// A service a caller may be granted, by its config name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceName {
    /// `toolgate.v1.AuthorizationService`: decisions, for executors.
    Authorization,
    /// `toolgate.v1.ApprovalService`: list, read, decide, watch, for approval UIs.
    Approvals,
    /// `toolgate.v1.LedgerService`: the execution ledger, for executors.
    Ledger,
    /// `toolgate.v1.PolicyService`: the live policy set and the last
    /// reload's error, for operators. Read-only, but it names policy files
    /// and shows diagnostics: neither executors nor approval UIs need it.
    Policy,
    /// gRPC server reflection: the public wire schema.
    Reflection,
    /// `toolgate.v1.EntityService`: the entity store (DESIGN §11.6), for
    /// the deployment's own data feed, per tenant. Writing entities changes
    /// decisions: neither executors nor approval UIs need it.
    Entities,
    /// The OpenID AuthZEN door over HTTP (`/.well-known/authzen-configuration`,
    /// `/access/v1/*`): decisions for MCP gateways and other AuthZEN PEPs.
    Authzen,
    /// Not a service of its own but a right on `LedgerService`:
    /// `ReconcileExecution` without the attempt's fencing token, for the
    /// tenants of the grant (an operator's reconciler). Executors reconcile
    /// their own attempts with their token and need no such grant.
    Reconcile,
    /// Envoy's `envoy.service.auth.v3.Authorization` (ext_authz): decisions
    /// on MCP traffic for Envoy, Istio and agentgateway.
    ExtAuthz,
    /// The approval console (`/console/`, DESIGN §12): a web page and its
    /// JSON API for approvers, in front of the same approval desk. Like
    /// `approvals`, it acts for the tenant of the approver's verified token.
    Console,
}

impl ServiceName {
    /// Every grantable service, in config-name order.
    pub const ALL: [Self; 10] = [
        Self::Authorization,
        Self::Approvals,
        Self::Ledger,
        Self::Policy,
        Self::Reflection,
        Self::Entities,
        Self::Authzen,
        Self::Reconcile,
        Self::ExtAuthz,
        Self::Console,
    ];

    /// The name used in `[[access]] services`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Authorization => "authorization",
            Self::Approvals => "approvals",
            Self::Ledger => "ledger",
            Self::Policy => "policy",
            Self::Reflection => "reflection",
            Self::Entities => "entities",
            Self::Authzen => "authzen",
            Self::Reconcile => "reconcile",
            Self::ExtAuthz => "ext_authz",
            Self::Console => "console",
        }
    }

    /// Whether the service is plain HTTP (a door of its own, not gRPC):
    /// gRPC-Web leaves it alone, and a refusal is an HTTP `403`, not a
    /// gRPC status.
    #[must_use]
    pub const fn is_plain_http(self) -> bool {
        matches!(self, Self::Authzen | Self::Console)
    }

    /// The service a config name stands for.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// What a request path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `grpc.health.v1.Health`: open to every connected caller, so probes
    /// and load balancers need no grant. It reveals only serving status.
    Health,
    /// A grantable service.
    Service(ServiceName),
    /// Anything else: refused whenever grants are configured.
    Unknown,
}

/// The target of a request path: a gRPC path (`/package.Service/Method`)
/// or one of the AuthZEN door's HTTP paths.
#[must_use]
pub fn target_of_path(path: &str) -> Target {
    if path == "/.well-known/authzen-configuration" || path.starts_with("/access/v1/") {
        return Target::Service(ServiceName::Authzen);
    }
    if path == "/console" || path.starts_with("/console/") {
        return Target::Service(ServiceName::Console);
    }
    let service = path
        .strip_prefix('/')
        .and_then(|p| p.split('/').next())
        .unwrap_or("");
    match service {
        "grpc.health.v1.Health" => Target::Health,
        "toolgate.v1.AuthorizationService" => Target::Service(ServiceName::Authorization),
        "toolgate.v1.ApprovalService" => Target::Service(ServiceName::Approvals),
        "toolgate.v1.LedgerService" => Target::Service(ServiceName::Ledger),
        "toolgate.v1.PolicyService" => Target::Service(ServiceName::Policy),
        "toolgate.v1.EntityService" => Target::Service(ServiceName::Entities),
        "envoy.service.auth.v3.Authorization" => Target::Service(ServiceName::ExtAuthz),
        "grpc.reflection.v1.ServerReflection" | "grpc.reflection.v1alpha.ServerReflection" => {
            Target::Service(ServiceName::Reflection)
        }
        _ => Target::Unknown,
    }
}

/// One `[[access]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub caller: CallerPattern,
    pub services: BTreeSet<ServiceName>,
    /// The tenants the caller may act for through this grant's
    /// `authorization`, `ledger` and `entities` services (approvers' tenant comes from
    /// their verified token, so other services need none).
    pub tenants: TenantScope,
}

/// The grants of a deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessPolicy {
    /// No grants configured: every caller may call every service. Only
    /// accepted on a loopback TCP listener without TLS (the development
    /// default), with a warning at startup.
    Open,
    /// A caller may call a service if any grant matching it lists it.
    Grants(Vec<Grant>),
}

impl AccessPolicy {
    /// Whether `peer` may call `target`.
    #[must_use]
    pub fn allows(&self, peer: &PeerIdentity, target: Target) -> bool {
        match (self, target) {
            (_, Target::Health) | (Self::Open, _) => true,
            (Self::Grants(_), Target::Unknown) => false,
            (Self::Grants(grants), Target::Service(service)) => grants
                .iter()
                .any(|g| g.services.contains(&service) && g.caller.matches(peer)),
        }
    }

    /// Whether the DNS-rebinding guard ([`admits_http1`]) holds on a
    /// listener of `transport` (DESIGN §9): on every plaintext loopback TCP
    /// listener, with no grants and with grants alike, since there nothing
    /// tells a browser's request from a local process's (`cn:`/`san:` need
    /// TLS with client certificates, `uid:` a Unix socket, so only
    /// `caller = "any"` grants can match there); and under open access on
    /// any TCP listener, so a listener that trusts everybody fails closed.
    /// A Unix socket is out of a browser's reach, and over TLS a rebound
    /// name fails the browser's own certificate check.
    #[must_use]
    pub fn rebinding_guard(&self, transport: Transport) -> bool {
        match transport {
            Transport::Unix => false,
            Transport::Tcp { loopback, tls } => matches!(self, Self::Open) || (loopback && !tls),
        }
    }

    /// The tenants `peer` may act for on `service`: every tenant under open
    /// access, else the union of the tenants of its grants of `service`.
    #[must_use]
    pub fn tenants(&self, peer: &PeerIdentity, service: ServiceName) -> TenantScope {
        match self {
            Self::Open => TenantScope::Any,
            Self::Grants(grants) => grants
                .iter()
                .filter(|g| g.services.contains(&service) && g.caller.matches(peer))
                .fold(TenantScope::default(), |scope, g| {
                    scope.union(g.tenants.clone())
                }),
        }
    }
}
