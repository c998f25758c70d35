//! Who may call which service (DESIGN §9): the transport identity of a
//! connection, and the grants that map it to the services it may call.
//!
//! An agent executor that can reach `DecideApproval` can approve its own
//! calls, so the approval UI and the executor get separate grants. The
//! identity comes from the transport only — a client certificate's subject
//! CN or SAN (DNS or URI, e.g. a SPIFFE id), or a Unix peer's uid — never
//! from a request field. This module holds the rules; `grpc/` reads the
//! identity off the connection and enforces them in one layer.
//!
//! A grant also names the tenants its caller may act for ([`TenantScope`]):
//! an executor of one tenant that sends another tenant's id is refused,
//! whatever roles it claims. The layer hands the scope to the desks, which
//! check it against the tenant the request runs as (the principal, after
//! any identity token is verified), not against a field as sent.

use std::collections::BTreeSet;
use std::fmt;

use crate::envelope::TenantNotGranted;

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

/// The transport identity of one connection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerIdentity {
    /// The client certificate's subject common name(s).
    pub common_names: Vec<String>,
    /// The client certificate's DNS and URI subject alternative names.
    pub sans: Vec<String>,
    /// The Unix peer's uid (Unix domain socket listeners).
    pub uid: Option<u32>,
}

impl PeerIdentity {
    /// The identity a DER client certificate names. The certificate was
    /// already verified against the configured client CA by the TLS layer;
    /// this only reads it. A certificate that cannot be parsed names nobody.
    #[must_use]
    pub fn from_certificate_der(der: &[u8]) -> Self {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return Self::default();
        };
        let common_names = cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok())
            .map(str::to_owned)
            .collect();
        let mut sans = Vec::new();
        if let Ok(Some(ext)) = cert.subject_alternative_name() {
            for name in &ext.value.general_names {
                match name {
                    x509_parser::extensions::GeneralName::DNSName(s)
                    | x509_parser::extensions::GeneralName::URI(s) => sans.push((*s).to_owned()),
                    _ => {}
                }
            }
        }
        Self {
            common_names,
            sans,
            uid: None,
        }
    }

    /// A Unix peer.
    #[must_use]
    pub fn unix(uid: Option<u32>) -> Self {
        Self {
            uid,
            ..Self::default()
        }
    }

    /// Whether the connection proved nothing about who is calling.
    #[must_use]
    pub fn is_anonymous(&self) -> bool {
        self.common_names.is_empty() && self.sans.is_empty() && self.uid.is_none()
    }
}

impl fmt::Display for PeerIdentity {
    /// A short label for logs and the audit log: the first SAN, else the
    /// first CN, else the uid, else `anonymous`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(san) = self.sans.first() {
            write!(f, "san:{san}")
        } else if let Some(cn) = self.common_names.first() {
            write!(f, "cn:{cn}")
        } else if let Some(uid) = self.uid {
            write!(f, "uid:{uid}")
        } else {
            f.write_str("anonymous")
        }
    }
}

/// Who a grant is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallerPattern {
    /// Every caller, even one the transport says nothing about.
    Any,
    /// A client certificate whose subject CN is exactly this.
    Cn(String),
    /// A client certificate with this DNS or URI SAN, exactly.
    San(String),
    /// A Unix peer with this uid.
    Uid(u32),
}

impl CallerPattern {
    /// Parses `any`, `cn:NAME`, `san:NAME` or `uid:N`.
    ///
    /// # Errors
    /// A message saying what forms are accepted.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not `any`, `cn:NAME`, `san:NAME` or `uid:N`");
        if text == "any" {
            return Ok(Self::Any);
        }
        let (kind, value) = text.split_once(':').ok_or_else(bad)?;
        if value.is_empty() {
            return Err(bad());
        }
        match kind {
            "cn" => Ok(Self::Cn(value.to_owned())),
            "san" => Ok(Self::San(value.to_owned())),
            "uid" => value.parse().map(Self::Uid).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }

    fn matches(&self, peer: &PeerIdentity) -> bool {
        match self {
            Self::Any => true,
            Self::Cn(cn) => peer.common_names.iter().any(|c| c == cn),
            Self::San(san) => peer.sans.iter().any(|s| s == san),
            Self::Uid(uid) => peer.uid == Some(*uid),
        }
    }
}

/// The tenants a caller may act for.
///
/// The default is no tenant at all: a request whose scope was never set (a
/// wiring mistake) is refused, never allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantScope {
    /// Every tenant: `tenants = ["*"]`, said explicitly, or open access.
    Any,
    /// Exactly these tenant ids.
    Only(BTreeSet<String>),
}

impl Default for TenantScope {
    fn default() -> Self {
        Self::Only(BTreeSet::new())
    }
}

impl TenantScope {
    /// The scope of `tenants` as configured: `*` anywhere is every tenant.
    #[must_use]
    pub fn of<I, S>(tenants: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut only = BTreeSet::new();
        for tenant in tenants {
            let tenant = tenant.into();
            if tenant == "*" {
                return Self::Any;
            }
            only.insert(tenant);
        }
        Self::Only(only)
    }

    /// Whether a request may run as `tenant`.
    #[must_use]
    pub fn allows(&self, tenant: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Only(tenants) => tenants.contains(tenant),
        }
    }

    /// The one check of decisions and the ledger, made on the tenant the
    /// request runs as (the established principal's).
    ///
    /// # Errors
    /// [`TenantNotGranted`] naming `tenant` when the scope does not hold it.
    pub fn admit(&self, tenant: &str) -> Result<(), TenantNotGranted> {
        if self.allows(tenant) {
            Ok(())
        } else {
            Err(TenantNotGranted::new(tenant))
        }
    }

    /// The tenants of either scope.
    #[must_use]
    pub fn union(self, other: Self) -> Self {
        match (self, other) {
            (Self::Any, _) | (_, Self::Any) => Self::Any,
            (Self::Only(mut a), Self::Only(b)) => {
                a.extend(b);
                Self::Only(a)
            }
        }
    }

    /// Whether no tenant at all is allowed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::Only(t) if t.is_empty())
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

/// What a listener is, as far as the DNS-rebinding guard cares
/// ([`AccessPolicy::rebinding_guard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// TCP: on a loopback address or not, with TLS or plaintext.
    Tcp {
        /// The bound address is a loopback one.
        loopback: bool,
        /// The listener speaks TLS.
        tls: bool,
    },
    /// A Unix domain socket.
    Unix,
}

/// The DNS-rebinding guard, where it holds
/// ([`AccessPolicy::rebinding_guard`]). A loopback listener trusts every
/// process that can reach its port, and a browser can reach it too: a page
/// of `evil.example` whose name is made to resolve to 127.0.0.1 sends
/// requests that are same-origin to the browser, so CORS never stops them.
/// Over HTTP/1.x (the only version a browser speaks to a plain-text
/// listener; h2c is never a browser) such a request carries the page's host
/// in `Host` and its origin in `Origin`. So an HTTP/1.x request must name a
/// loopback host (`localhost`, 127.0.0.0/8, `[::1]`, with any port; a
/// missing `Host` is refused), and an `Origin`, when sent, must be a
/// loopback origin or one of the configured gRPC-Web origins
/// (`allowed_origins`, exact).
///
/// # Errors
///
/// [`BrowserRefusal`] names which header was refused.
pub fn admits_http1(
    host: Option<&str>,
    origin: Option<&str>,
    allowed_origins: &[String],
) -> Result<(), BrowserRefusal> {
    if !host.is_some_and(is_loopback_authority) {
        return Err(BrowserRefusal::Host);
    }
    match origin {
        None => Ok(()),
        Some(o) if allowed_origins.iter().any(|a| a == o) || is_loopback_origin(o) => Ok(()),
        Some(_) => Err(BrowserRefusal::Origin),
    }
}

/// The tenants whose ledger records a caller may reconcile without the
/// attempt's fencing token: its `reconcile` grants' tenants (every tenant
/// under open access). Set by the access layer on every ledger request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReconcileScope(pub TenantScope);

/// Which header of an HTTP/1.x request the DNS-rebinding guard refused
/// ([`admits_http1`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrowserRefusal {
    /// `Host` missing or not a loopback name.
    Host,
    /// `Origin` neither loopback nor configured.
    Origin,
}

impl BrowserRefusal {
    /// The stable reason, for `ErrorInfo` and the metrics.
    #[must_use]
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Host => "host_not_loopback",
            Self::Origin => "origin_not_allowed",
        }
    }
}

/// Whether an authority (`host[:port]`) names the loopback interface:
/// `localhost` (any case, a trailing dot allowed), an IPv4 address in
/// 127.0.0.0/8, or `[::1]`. Anything else, a name that merely resolves
/// to loopback included, is not: that name is what rebinding controls.
fn is_loopback_authority(authority: &str) -> bool {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return false;
        };
        if !(after.is_empty() || is_port(after)) {
            return false;
        }
        return inside
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|a| a.is_loopback());
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) if is_port(&format!(":{port}")) => host,
            Some(_) => return false,
            None => authority,
        }
    };
    let name = host.strip_suffix('.').unwrap_or(host);
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback())
}

/// `:` followed by 1 to 5 digits.
fn is_port(text: &str) -> bool {
    text.strip_prefix(':')
        .is_some_and(|p| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether an `Origin` is `http://` or `https://` and a loopback authority.
fn is_loopback_origin(origin: &str) -> bool {
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(is_loopback_authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(caller: &str, services: &[ServiceName]) -> Grant {
        Grant {
            caller: CallerPattern::parse(caller).unwrap(),
            services: services.iter().copied().collect(),
            tenants: TenantScope::Any,
        }
    }

    fn only(tenants: &[&str]) -> TenantScope {
        TenantScope::of(tenants.iter().copied())
    }

    #[test]
    fn a_tenant_scope_allows_only_what_it_names() {
        let acme = only(&["acme"]);
        assert!(acme.allows("acme"));
        assert!(!acme.allows("globex"));
        assert!(!acme.allows(""));
        assert!(!acme.allows("ACME"));
        assert_eq!(acme.admit("globex"), Err(TenantNotGranted::new("globex")));
        assert_eq!(acme.admit("acme"), Ok(()));
        // `*` is every tenant, wherever it stands.
        assert_eq!(only(&["acme", "*"]), TenantScope::Any);
        assert!(TenantScope::Any.allows("anyone"));
        // The default is nothing: a scope that was never set refuses.
        assert!(TenantScope::default().is_empty());
        assert!(!TenantScope::default().allows("acme"));
        assert!(only(&[]).is_empty());
        // A union holds both sides; `Any` absorbs.
        let both = acme.clone().union(only(&["globex"]));
        assert!(both.allows("acme") && both.allows("globex") && !both.allows("initech"));
        assert_eq!(acme.union(TenantScope::Any), TenantScope::Any);
    }

    #[test]
    fn a_callers_tenants_are_the_union_of_its_grants_of_the_service() {
        use ServiceName::{Approvals, Authorization, Ledger};
        let executor = PeerIdentity::unix(Some(1000));
        let with = |services: &[ServiceName], tenants: &[&str]| Grant {
            tenants: only(tenants),
            ..grant("uid:1000", services)
        };
        let policy = AccessPolicy::Grants(vec![
            with(&[Authorization, Ledger], &["acme"]),
            with(&[Authorization], &["globex"]),
            with(&[Approvals], &["*"]),
            Grant {
                tenants: only(&["initech"]),
                ..grant("uid:1001", &[Authorization])
            },
        ]);
        assert_eq!(
            policy.tenants(&executor, Authorization),
            only(&["acme", "globex"])
        );
        assert_eq!(policy.tenants(&executor, Ledger), only(&["acme"]));
        assert_eq!(policy.tenants(&executor, Approvals), TenantScope::Any);
        assert!(
            policy
                .tenants(&PeerIdentity::unix(Some(7)), Ledger)
                .is_empty()
        );
        assert_eq!(
            AccessPolicy::Open.tenants(&PeerIdentity::default(), Ledger),
            TenantScope::Any
        );
    }

    #[test]
    fn paths_map_to_services() {
        assert_eq!(
            target_of_path("/toolgate.v1.ApprovalService/DecideApproval"),
            Target::Service(ServiceName::Approvals)
        );
        assert_eq!(
            target_of_path("/toolgate.v1.AuthorizationService/Authorize"),
            Target::Service(ServiceName::Authorization)
        );
        assert_eq!(
            target_of_path("/toolgate.v1.LedgerService/BeginExecution"),
            Target::Service(ServiceName::Ledger)
        );
        assert_eq!(
            target_of_path("/toolgate.v1.PolicyService/GetPolicyStatus"),
            Target::Service(ServiceName::Policy)
        );
        assert_eq!(
            target_of_path("/toolgate.v1.EntityService/UpsertEntities"),
            Target::Service(ServiceName::Entities)
        );
        assert_eq!(
            target_of_path("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            Target::Service(ServiceName::Reflection)
        );
        assert_eq!(
            target_of_path("/grpc.health.v1.Health/Check"),
            Target::Health
        );
        assert_eq!(
            target_of_path("/envoy.service.auth.v3.Authorization/Check"),
            Target::Service(ServiceName::ExtAuthz)
        );
        assert_eq!(
            target_of_path("/.well-known/authzen-configuration"),
            Target::Service(ServiceName::Authzen)
        );
        assert_eq!(
            target_of_path("/access/v1/evaluations"),
            Target::Service(ServiceName::Authzen)
        );
        assert_eq!(target_of_path("/access/v2/evaluation"), Target::Unknown);
        for console in ["/console", "/console/", "/console/api/events"] {
            assert_eq!(
                target_of_path(console),
                Target::Service(ServiceName::Console)
            );
        }
        assert_eq!(target_of_path("/consoles"), Target::Unknown);
        assert_eq!(target_of_path("/evil.Service/X"), Target::Unknown);
        assert_eq!(target_of_path(""), Target::Unknown);
    }

    #[test]
    fn grants_separate_the_executor_from_the_approval_ui() {
        use ServiceName::{Approvals, Authorization, Ledger, Policy};
        let policy = AccessPolicy::Grants(vec![
            grant("san:spiffe://acme/executor", &[Authorization, Ledger]),
            grant("cn:approval-ui", &[Approvals]),
            grant("uid:1000", &[Authorization]),
            grant("cn:operator", &[Policy]),
        ]);
        let operator = PeerIdentity {
            common_names: vec!["operator".into()],
            ..PeerIdentity::default()
        };
        let executor = PeerIdentity {
            sans: vec!["spiffe://acme/executor".into()],
            ..PeerIdentity::default()
        };
        let ui = PeerIdentity {
            common_names: vec!["approval-ui".into()],
            ..PeerIdentity::default()
        };
        let approvals = Target::Service(Approvals);
        let authorization = Target::Service(Authorization);
        assert!(policy.allows(&executor, authorization));
        assert!(policy.allows(&executor, Target::Service(Ledger)));
        assert!(!policy.allows(&executor, approvals));
        assert!(policy.allows(&ui, approvals));
        assert!(!policy.allows(&ui, authorization));
        // Policy status is the operator's alone.
        assert!(policy.allows(&operator, Target::Service(Policy)));
        assert!(!policy.allows(&operator, authorization));
        assert!(!policy.allows(&executor, Target::Service(Policy)));
        assert!(!policy.allows(&ui, Target::Service(Policy)));
        assert!(policy.allows(&PeerIdentity::unix(Some(1000)), authorization));
        assert!(!policy.allows(&PeerIdentity::unix(Some(1001)), authorization));
        assert!(!policy.allows(&PeerIdentity::default(), authorization));
        // Health is open; an unknown service is closed.
        assert!(policy.allows(&PeerIdentity::default(), Target::Health));
        assert!(!policy.allows(&executor, Target::Unknown));
        assert!(AccessPolicy::Open.allows(&PeerIdentity::default(), approvals));
    }

    #[test]
    fn caller_patterns_are_strict() {
        assert_eq!(CallerPattern::parse("any"), Ok(CallerPattern::Any));
        assert_eq!(CallerPattern::parse("uid:0"), Ok(CallerPattern::Uid(0)));
        for bad in ["", "cn:", "uid:x", "ip:1.2.3.4", "ANY", "spiffe://x"] {
            assert!(CallerPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_certificate_names_its_cn_and_sans() {
        let mut params =
            rcgen::CertificateParams::new(vec!["executor.acme.internal".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "executor");
        params.subject_alt_names.push(rcgen::SanType::URI(
            rcgen::string::Ia5String::try_from("spiffe://acme/executor").unwrap(),
        ));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let peer = PeerIdentity::from_certificate_der(cert.der());
        assert_eq!(peer.common_names, vec!["executor".to_owned()]);
        assert_eq!(
            peer.sans,
            vec![
                "executor.acme.internal".to_owned(),
                "spiffe://acme/executor".to_owned()
            ]
        );
        assert_eq!(peer.to_string(), "san:executor.acme.internal");
        assert!(PeerIdentity::from_certificate_der(b"junk").is_anonymous());
    }

    #[test]
    fn the_guard_admits_only_loopback_hosts_and_origins_over_http1() {
        let allowed = vec!["https://approvals.example.com".to_owned()];
        for host in [
            "127.0.0.1:50051",
            "127.3.4.5:1",
            "localhost:50051",
            "LOCALHOST",
            "localhost.:80",
            "[::1]:50051",
            "[::1]",
            "127.0.0.1",
        ] {
            assert_eq!(admits_http1(Some(host), None, &allowed), Ok(()), "{host}");
        }
        for host in [
            "evil.example:50051",
            "evil.example",
            "localhost.evil.example:50051",
            "127.0.0.1.nip.io:50051",
            "0.0.0.0:50051",
            "10.0.0.1:50051",
            "[::2]:50051",
            "[::1]x",
            "127.0.0.1:port",
            "127.0.0.1:123456",
            "",
        ] {
            assert_eq!(
                admits_http1(Some(host), None, &allowed),
                Err(BrowserRefusal::Host),
                "{host}"
            );
        }
        assert_eq!(
            admits_http1(None, None, &allowed),
            Err(BrowserRefusal::Host)
        );
        let host = Some("127.0.0.1:50051");
        for origin in [
            "http://localhost:3000",
            "https://127.0.0.1",
            "http://[::1]:8080",
            "https://approvals.example.com",
        ] {
            assert_eq!(
                admits_http1(host, Some(origin), &allowed),
                Ok(()),
                "{origin}"
            );
        }
        for origin in [
            "http://evil.example:50051",
            "null",
            "https://approvals.example.com.evil.example",
            "http://approvals.example.com",
            "file://",
            "localhost:3000",
        ] {
            assert_eq!(
                admits_http1(host, Some(origin), &allowed),
                Err(BrowserRefusal::Origin),
                "{origin}"
            );
        }
    }

    #[test]
    fn the_guard_holds_on_every_plaintext_loopback_listener_grants_or_none() {
        let open = AccessPolicy::Open;
        let any = AccessPolicy::Grants(vec![Grant {
            caller: CallerPattern::Any,
            services: BTreeSet::from([ServiceName::Authorization]),
            tenants: TenantScope::Any,
        }]);
        let plain_loopback = Transport::Tcp {
            loopback: true,
            tls: false,
        };
        let tls_loopback = Transport::Tcp {
            loopback: true,
            tls: true,
        };
        let plain_public = Transport::Tcp {
            loopback: false,
            tls: false,
        };
        let table = [
            (&open, plain_loopback, true),
            (&any, plain_loopback, true),
            (&open, plain_public, true),
            (&any, plain_public, false),
            (&open, tls_loopback, true),
            (&any, tls_loopback, false),
            (&any, Transport::Unix, false),
            (&open, Transport::Unix, false),
        ];
        for (policy, transport, guarded) in table {
            assert_eq!(
                policy.rebinding_guard(transport),
                guarded,
                "{policy:?} on {transport:?}"
            );
        }
    }
}

/// What one listener lets all its callers together hold at once
/// (`[limits]`, DESIGN §9): past each limit the next one is refused at once,
/// never queued, so an overloaded or attacked sidecar answers quickly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Open connections (TLS handshakes included); one more is closed as
    /// soon as it is accepted.
    pub max_connections: usize,
    /// HTTP/2 streams open at once on one connection (the server's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub max_concurrent_streams: u32,
    /// Calls in progress at once, watches excepted; one more is answered
    /// `RESOURCE_EXHAUSTED` (retryable) at once.
    pub max_calls_in_flight: usize,
    /// The longest one call may take, request body included; then it is
    /// answered `CANCELLED` and its work dropped. Watches are not bounded by it.
    pub request_timeout: std::time::Duration,
    /// `grpc.health.v1.Health/Watch` streams open at once.
    pub max_health_watches: usize,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_concurrent_streams: 256,
            max_calls_in_flight: 1024,
            request_timeout: std::time::Duration::from_secs(15),
            max_health_watches: 64,
        }
    }
}
