//! The access rules' tests.

use super::*;
use crate::envelope::TenantNotGranted;

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
