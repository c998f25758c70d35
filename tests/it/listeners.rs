//! Who may call, over real sockets: a Unix socket created owner-only whose
//! peer uid is granted some services, and mutual TLS where the executor's
//! certificate (a SPIFFE id), the approval UI's and the operator's (CNs)
//! are granted different services; callers without a trusted certificate
//! get nothing.
//! Certificates are made here, at test time, with rcgen.

use std::collections::BTreeSet;
use std::time::Duration;

use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_types::StatusExt;

use toolgate::access::{AccessPolicy, CallerPattern, Grant, ServiceName, TenantScope};
use toolgate::config::{ListenAddr, TlsFiles};
use toolgate::grpc::pb::approval_service_client::ApprovalServiceClient;
use toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient;
use toolgate::grpc::pb::ledger_service_client::LedgerServiceClient;
use toolgate::grpc::pb::policy_service_client::PolicyServiceClient;
use toolgate::grpc::pb::{self, Decision};

use crate::support::{TestServer, agent_bob, request, token};

const SMALL_REFUND: &str =
    r#"{"order_id":"ord_1001","amount_cents":2500,"currency":"USD","reason":"late"}"#;

fn grant(caller: &str, services: &[ServiceName]) -> Grant {
    Grant {
        caller: CallerPattern::parse(caller).unwrap(),
        services: services.iter().copied().collect::<BTreeSet<_>>(),
        tenants: TenantScope::Any,
    }
}

/// The reason of a `PERMISSION_DENIED` status's `ErrorInfo`.
fn denied_reason(status: &tonic::Status) -> String {
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    status
        .get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// A ledger read of a key nobody has: NOT_FOUND once past the grants.
fn no_such_execution() -> pb::GetExecutionRequest {
    pb::GetExecutionRequest {
        auth: Some(agent_bob()),
        idempotency_key: "refund_order:none".into(),
    }
}

fn decide_request() -> pb::DecideApprovalRequest {
    pb::DecideApprovalRequest {
        identity_token: token("dana", "acme", &["support_admin"]),
        approval_id: "0195e2b0-0000-7000-8000-000000000000".into(),
        verdict: pb::Verdict::Approve.into(),
        arguments_sha256: "0".repeat(64),
        reason: "self-approval attempt".into(),
    }
}

async fn unix_channel(path: std::path::PathBuf) -> Channel {
    Endpoint::from_static("http://uds.invalid")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .unwrap()
}

/// This process's uid, from a file it creates (no unsafe `getuid`).
fn my_uid(dir: &std::path::Path) -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    let probe = dir.join("uid-probe");
    std::fs::write(&probe, b"").unwrap();
    std::fs::metadata(&probe).unwrap().uid()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_is_owner_only_and_its_peer_uid_is_granted_services() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let uid = my_uid(dir.path());
    let path = dir.path().join("toolgate.sock");
    // A stale socket from a crashed run is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let server = TestServer::start_setup(|c| {
        c.listen = ListenAddr::Unix(path.clone());
        c.access = AccessPolicy::Grants(vec![grant(
            &format!("uid:{uid}"),
            &[ServiceName::Authorization, ServiceName::Ledger],
        )]);
    })
    .await;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");

    let channel = unix_channel(path.clone()).await;
    let allowed = AuthorizationServiceClient::new(channel.clone())
        .authorize(request("refund_order", SMALL_REFUND))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allowed.decision(), Decision::Allow, "{:?}", allowed.error);
    let refused = ApprovalServiceClient::new(channel)
        .decide_approval(decide_request())
        .await
        .unwrap_err();
    assert_eq!(denied_reason(&refused), "caller_not_granted");
    assert!(
        refused.message().contains(&format!("uid:{uid}")),
        "{refused:?}"
    );
    server.stop().await;
    assert!(!path.exists(), "the socket file is removed on shutdown");
}

/// A certificate and its private key, PEM.
type KeyPair = (String, String);

/// A CA and the certificates it issues, made fresh for each test.
pub(crate) struct Pki {
    pub(crate) ca_pem: String,
    ca: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    pub(crate) fn new(name: &str) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self {
            ca_pem: cert.pem(),
            ca: rcgen::Issuer::new(params, key),
        }
    }

    /// The server's TLS files, as a deployment configures them: a
    /// `localhost` certificate this CA issued, its key, and this CA as the
    /// client CA, written in `dir`.
    pub(crate) fn server_files(&self, dir: &std::path::Path) -> TlsFiles {
        let (cert, key) = self.issue("toolgate", &["localhost"], &[], true);
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        TlsFiles {
            cert: write("server.pem", &cert),
            key: write("server.key", &key),
            client_ca: Some(write("ca.pem", &self.ca_pem)),
        }
    }

    /// (certificate PEM, key PEM) for `cn` with DNS or URI SANs.
    pub(crate) fn issue(
        &self,
        cn: &str,
        dns: &[&str],
        uris: &[&str],
        server: bool,
    ) -> (String, String) {
        let mut params =
            rcgen::CertificateParams::new(dns.iter().map(|d| (*d).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        for uri in uris {
            params.subject_alt_names.push(rcgen::SanType::URI(
                rcgen::string::Ia5String::try_from(*uri).unwrap(),
            ));
        }
        params.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

pub(crate) async fn tls_channel(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    client: Option<&(String, String)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = client {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_maps_certificates_to_grants() {
    let pki = Pki::new("toolgate test CA");
    let executor = pki.issue("executor", &[], &["spiffe://acme/executor"], false);
    let ui = pki.issue("approval-ui", &[], &[], false);
    let operator = pki.issue("toolgate-operator", &[], &[], false);
    let stranger = Pki::new("someone else's CA");
    let untrusted = stranger.issue("executor", &[], &["spiffe://acme/executor"], false);

    // The server reads its TLS identity and client CA from files, as configured.
    let pem = tempfile::tempdir().unwrap();
    let tls = pki.server_files(pem.path());
    let server = TestServer::start_setup(|c| {
        c.access = AccessPolicy::Grants(vec![
            grant(
                "san:spiffe://acme/executor",
                &[ServiceName::Authorization, ServiceName::Ledger],
            ),
            grant("cn:approval-ui", &[ServiceName::Approvals]),
            grant("cn:toolgate-operator", &[ServiceName::Policy]),
        ]);
        c.tls = Some(tls);
    })
    .await;

    // The executor decides…
    let channel = tls_channel(server.addr, &pki.ca_pem, Some(&executor))
        .await
        .unwrap();
    let allowed = AuthorizationServiceClient::new(channel.clone())
        .authorize(request("refund_order", SMALL_REFUND))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allowed.decision(), Decision::Allow, "{:?}", allowed.error);
    // …reaches its ledger (no such record: the call got past the grants)…
    let missing = LedgerServiceClient::new(channel.clone())
        .get_execution(no_such_execution())
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");
    // …and can never approve, nor read the operators' policy status.
    let refused = ApprovalServiceClient::new(channel.clone())
        .decide_approval(decide_request())
        .await
        .unwrap_err();
    assert_eq!(denied_reason(&refused), "caller_not_granted");
    assert!(
        refused.message().contains("san:spiffe://acme/executor"),
        "{refused:?}"
    );
    let refused = PolicyServiceClient::new(channel)
        .get_policy_status(pb::GetPolicyStatusRequest {})
        .await
        .unwrap_err();
    assert_eq!(denied_reason(&refused), "caller_not_granted");

    // The operator reads the policy status, and nothing else.
    let channel = tls_channel(server.addr, &pki.ca_pem, Some(&operator))
        .await
        .unwrap();
    let status = PolicyServiceClient::new(channel.clone())
        .get_policy_status(pb::GetPolicyStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.policy_version, allowed.policy_version);
    let refused = LedgerServiceClient::new(channel)
        .get_execution(no_such_execution())
        .await
        .unwrap_err();
    assert_eq!(denied_reason(&refused), "caller_not_granted");

    // The approval UI reaches the desk (the approval does not exist) but not decisions.
    let channel = tls_channel(server.addr, &pki.ca_pem, Some(&ui))
        .await
        .unwrap();
    let missing = ApprovalServiceClient::new(channel.clone())
        .decide_approval(decide_request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(missing.error.unwrap().code, "approval_not_found");
    let refused = AuthorizationServiceClient::new(channel)
        .authorize(request("refund_order", SMALL_REFUND))
        .await
        .unwrap_err();
    assert_eq!(denied_reason(&refused), "caller_not_granted");

    // No certificate, or one from another CA: the handshake fails, no call runs.
    // The server's alert may race the client's first write: either the
    // alert or the closed connection is seen, never an answer. hyper
    // reports a connection closed before its HTTP/2 preface was read as
    // "connection was not ready".
    const CLOSED: [&str; 3] = [
        "connection closed",
        "broken pipe",
        "connection was not ready",
    ];
    let expected: [(Option<&KeyPair>, &str); 2] = [
        (None, "CertificateRequired"),
        (Some(&untrusted), "UnknownCA"),
    ];
    for (client, alert) in expected {
        let refusal = match tls_channel(server.addr, &pki.ca_pem, client).await {
            Err(e) => format!("{e:?}"),
            Ok(channel) => {
                let status = AuthorizationServiceClient::new(channel)
                    .authorize(request("refund_order", SMALL_REFUND))
                    .await
                    .expect_err("a caller without a trusted certificate was served");
                format!("{status:?}")
            }
        };
        assert!(
            refusal.contains(alert) || CLOSED.iter().any(|a| refusal.contains(a)),
            "expected {alert} or one of {CLOSED:?}: {refusal}"
        );
    }
    // Only the executor's call was ever decided.
    let text = server.metrics.encode();
    assert!(
        text.contains(
            "toolgate_decisions_total{tool=\"refund_order\",decision=\"allow\",code=\"\"} 1\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("toolgate_access_denied_total{service=\"approvals\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("toolgate_access_denied_total{service=\"authorization\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("toolgate_access_denied_total{service=\"policy\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("toolgate_access_denied_total{service=\"ledger\"} 1"),
        "{text}"
    );
    server.stop().await;
}
