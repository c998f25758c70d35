//! The configuration's keys, defaults, environment and errors.

use super::*;
use crate::access::{CallerPattern, ServiceName, TenantScope};
use crate::audit::{AuditSink, WhenFull};

#[test]
fn defaults_are_loopback_and_embedded_sqlite() {
    let c = Config::from_raw(RawConfig::default(), Overrides::default()).unwrap();
    assert_eq!(c.listen, ListenAddr::Tcp("127.0.0.1:50051".into()));
    assert_eq!(c.store, "sqlite://toolgate-data/toolgate.db");
    assert_eq!(c.policies, PathBuf::from("policies"));
    assert_eq!(
        c.reload,
        ReloadTriggers {
            watch: Some(Duration::from_millis(250)),
            sighup: true
        }
    );
}

#[test]
fn the_store_is_a_url_or_a_table_with_its_settings() {
    let raw: RawConfig = toml::from_str("store = \"postgres://db/toolgate\"\n").unwrap();
    let c = Config::from_raw(raw, Overrides::default()).unwrap();
    assert_eq!(c.store, "postgres://db/toolgate");
    assert_eq!(c.store_settings, StoreSettings::default());
    let raw: RawConfig = toml::from_str(
        "[store]\nurl = \"postgres://db/toolgate\"\npool_size = 4\nconnect_timeout_ms = 500\n\
         statement_timeout_ms = 1500\nhealth_interval_ms = 250\n",
    )
    .unwrap();
    let c = Config::from_raw(
        raw,
        Overrides {
            store: Some("postgres://other/toolgate".into()),
            ..Overrides::default()
        },
    )
    .unwrap();
    assert_eq!(c.store, "postgres://other/toolgate");
    assert_eq!(
        c.store_settings,
        StoreSettings {
            pool_size: 4,
            connect_timeout: Duration::from_millis(500),
            statement_timeout: Duration::from_millis(1500),
            health_interval: Duration::from_millis(250),
        }
    );
    assert_eq!(c.store_settings.call_bound(), Duration::from_millis(2000));
    let c = Config::from_raw(
        toml::from_str("[store]\npool_size = 2\n").unwrap(),
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(
        (c.store.as_str(), c.store_settings.pool_size),
        (DEFAULT_STORE, 2)
    );
    for (text, key) in [
        ("pool_size = 0", "store.pool_size"),
        ("connect_timeout_ms = 0", "store.connect_timeout_ms"),
        ("statement_timeout_ms = 0", "store.statement_timeout_ms"),
        ("health_interval_ms = 0", "store.health_interval_ms"),
    ] {
        let raw: RawConfig = toml::from_str(&format!("[store]\n{text}\n")).unwrap();
        match Config::from_raw(raw, Overrides::default()) {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    let unknown = toml::from_str::<RawConfig>("[store]\npool = 1\n").unwrap_err();
    assert!(
        unknown.to_string().contains("unknown field `pool`"),
        "{unknown}"
    );
    let wrong = toml::from_str::<RawConfig>("store = 3\n").unwrap_err();
    assert!(
        wrong.to_string().contains("a store URL or a [store] table"),
        "{wrong}"
    );
}

#[test]
fn reload_triggers_are_configurable_and_bounded() {
    let raw: RawConfig = toml::from_str(
        "[reload]
watch = false
",
    )
    .unwrap();
    let c = Config::from_raw(raw, Overrides::default()).unwrap();
    assert_eq!(
        c.reload,
        ReloadTriggers {
            watch: None,
            sighup: true
        }
    );
    let raw: RawConfig = toml::from_str(
        "[reload]
debounce_ms = 50
sighup = false
",
    )
    .unwrap();
    let c = Config::from_raw(raw, Overrides::default()).unwrap();
    assert_eq!(
        c.reload,
        ReloadTriggers {
            watch: Some(Duration::from_millis(50)),
            sighup: false
        }
    );
    for bad in ["0", "10001"] {
        let raw: RawConfig = toml::from_str(&format!(
            "[reload]
debounce_ms = {bad}
"
        ))
        .unwrap();
        assert!(matches!(
            Config::from_raw(raw, Overrides::default()),
            Err(ConfigError::Invalid {
                key: "reload.debounce_ms",
                ..
            })
        ));
    }
}

#[test]
fn unknown_keys_are_errors_and_flags_win() {
    let err =
        toml::from_str::<RawConfig>("listen = \"127.0.0.1:1\"\nlisten_port = 3\n").unwrap_err();
    assert!(
        err.to_string().contains("unknown field `listen_port`"),
        "{err}"
    );
    let raw: RawConfig = toml::from_str(
        "listen = \"127.0.0.1:1\"\n[limits]\nmax_depth = 8\n[[access]]\ncaller = \"any\"\nservices = [\"authorization\"]\ntenants = [\"*\"]\n",
    )
    .unwrap();
    let c = Config::from_raw(
        raw,
        Overrides {
            listen: Some("unix:/tmp/tg.sock".into()),
            ..Overrides::default()
        },
    )
    .unwrap();
    assert_eq!(c.listen, ListenAddr::Unix("/tmp/tg.sock".into()));
    assert_eq!(c.authorizer.limits.max_depth, 8);
    assert_eq!(c.authorizer.entity_limits.max_depth, 8);
    assert_eq!(
        c.authorizer.entity_limits.max_bytes,
        crate::decision::DEFAULT_MAX_ENTITIES_BYTES
    );
    let bad = Config::from_raw(
        RawConfig::default(),
        Overrides {
            listen: Some("nowhere".into()),
            ..Overrides::default()
        },
    );
    assert!(matches!(
        bad,
        Err(ConfigError::Invalid { key: "listen", .. })
    ));
}

#[test]
fn the_ledger_section_sets_budget_leases_and_retention() {
    let c = Config::from_raw(RawConfig::default(), Overrides::default()).unwrap();
    assert_eq!(c.ledger, LedgerConfig::default());
    assert_eq!(c.ledger.retention, Duration::from_secs(86_400));
    let raw: RawConfig = toml::from_str(
        "[ledger]\ndefault_max_attempts = 5\nlease_margin_ms = 100\nmax_lease_ms = 60000\n\
         retention_seconds = 3600\ncollect_interval_seconds = 10\ncollect_batch = 50\n\
         ticket_ttl_seconds = 30\n",
    )
    .unwrap();
    let c = Config::from_raw(raw, Overrides::default()).unwrap();
    assert_eq!(
        c.ledger,
        LedgerConfig {
            default_max_attempts: 5,
            lease_margin: Duration::from_millis(100),
            max_lease: Duration::from_secs(60),
            retention: Duration::from_secs(3600),
            collect_interval: Duration::from_secs(10),
            collect_batch: 50,
            ticket_ttl: Duration::from_secs(30),
        }
    );
    for (text, key) in [
        ("default_max_attempts = 0", "ledger.default_max_attempts"),
        ("max_lease_ms = 0", "ledger.max_lease_ms"),
        ("retention_seconds = 0", "ledger.retention_seconds"),
        ("collect_batch = 0", "ledger.collect_batch"),
        ("ticket_ttl_seconds = 0", "ledger.ticket_ttl_seconds"),
        ("retention_seconds = 60", "ledger.retention_seconds"),
    ] {
        let raw: RawConfig = toml::from_str(&format!("[ledger]\n{text}\n")).unwrap();
        match Config::from_raw(raw, Overrides::default()) {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    let unknown = toml::from_str::<RawConfig>("[ledger]\nlease_ms = 1\n").unwrap_err();
    assert!(
        unknown.to_string().contains("unknown field `lease_ms`"),
        "{unknown}"
    );
}

#[test]
fn identity_leeway_and_claim_names_are_configurable_and_bounded() {
    let raw: RawConfig = toml::from_str(
        "issuer = \"https://idp\"\n[identity]\nleeway_seconds = 10\n[identity.claims]\ntenant = \"org\"\nroles = \"groups\"\n",
    )
    .unwrap();
    let c = Config::from_raw(
        raw,
        Overrides {
            audience: Some("toolgate".into()),
            ..Overrides::default()
        },
    )
    .unwrap();
    assert_eq!(c.verifier.issuer.as_deref(), Some("https://idp"));
    assert_eq!(c.verifier.audience.as_deref(), Some("toolgate"));
    assert_eq!(c.verifier.leeway_seconds, 10);
    assert_eq!(c.verifier.claims.subject, "sub");
    assert_eq!(c.verifier.claims.tenant, "org");
    assert_eq!(c.verifier.claims.roles, "groups");
    assert_eq!(c.verifier.claims.scope, "scope");

    let too_lax: RawConfig = toml::from_str("[identity]\nleeway_seconds = 301\n").unwrap();
    assert!(matches!(
        Config::from_raw(too_lax, Overrides::default()),
        Err(ConfigError::Invalid {
            key: "identity.leeway_seconds",
            ..
        })
    ));
    let empty: RawConfig = toml::from_str("[identity.claims]\nsubject = \" \"\n").unwrap();
    assert!(matches!(
        Config::from_raw(empty, Overrides::default()),
        Err(ConfigError::Invalid {
            key: "identity.claims.subject",
            ..
        })
    ));
    let unknown = toml::from_str::<RawConfig>("[identity.claims]\nemail = \"e\"\n").unwrap_err();
    assert!(
        unknown.to_string().contains("unknown field `email`"),
        "{unknown}"
    );
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn load(toml_text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("toolgate.toml");
    std::fs::write(&path, toml_text).unwrap();
    Config::load_with_env(Some(&path), &env(vars), Overrides::default())
}

/// The environment is validated like the file: a typo is an error.
#[test]
fn environment_variables_set_keys_and_unknown_ones_are_refused() {
    let c = load(
        "listen = \"127.0.0.1:7\"\n[audit]\nqueue = 5\n",
        &[
            ("TOOLGATE_LISTEN", "127.0.0.1:9"),
            ("TOOLGATE_AUDIT__SINK", "none"),
            ("TOOLGATE_RATE_LIMITS__TENANT__PER_SECOND", "5"),
            ("TOOLGATE_PYTHON", "/usr/bin/python3"),
        ],
    )
    .unwrap();
    assert_eq!(c.listen, ListenAddr::Tcp("127.0.0.1:9".into()));
    assert_eq!(c.audit.sink, AuditSink::Discard);
    assert_eq!(c.audit.queue, 5, "the file's other keys stay");
    let tenant = c.rate_limits.tenant.unwrap();
    assert_eq!((tenant.calls.get(), tenant.burst.get()), (5, 5));

    let typo = load("", &[("TOOLGATE_LISTN", "127.0.0.1:9")]).unwrap_err();
    assert!(
        matches!(&typo, ConfigError::Environment { source } if source.to_string().contains("unknown field `listn`")),
        "{typo}"
    );
    let nested = load("", &[("TOOLGATE_AUDIT__SINKK", "stdout")]).unwrap_err();
    assert!(
        nested.to_string().contains("unknown field `sinkk`"),
        "{nested}"
    );
    let bad_value = load("", &[("TOOLGATE_AUDIT__SINK", "syslog")]).unwrap_err();
    assert!(
        matches!(
            bad_value,
            ConfigError::Invalid {
                key: "audit.sink",
                ..
            }
        ),
        "{bad_value}"
    );
    let bad_type = load("", &[("TOOLGATE_REQUIRE_IDENTITY_TOKEN", "yes")]).unwrap_err();
    assert!(
        matches!(bad_type, ConfigError::Environment { .. }),
        "{bad_type}"
    );
}

#[test]
fn grants_must_fit_the_listener() {
    let uds_open = load("listen = \"unix:/tmp/tg.sock\"\n", &[]).unwrap_err();
    assert!(
        matches!(uds_open, ConfigError::Invalid { key: "access", .. }),
        "{uds_open}"
    );
    let public_open = load("listen = \"0.0.0.0:50051\"\n", &[]).unwrap_err();
    assert!(matches!(
        public_open,
        ConfigError::Invalid { key: "access", .. }
    ));
    // A loopback listener: open, and guarded.
    for listen in ["127.0.0.1:50051", "127.0.0.2:1", "[::1]:50051"] {
        let config = load(&format!("listen = \"{listen}\"\n"), &[]).unwrap();
        assert_eq!(config.access, AccessPolicy::Open, "{listen}");
        assert!(config.rebinding_guard(), "{listen}");
    }
    let cn_without_mtls = load(
        "[[access]]\ncaller = \"cn:approval-ui\"\nservices = [\"approvals\"]\n",
        &[],
    )
    .unwrap_err();
    assert!(
        matches!(
            cn_without_mtls,
            ConfigError::Invalid {
                key: "access.caller",
                ..
            }
        ),
        "{cn_without_mtls}"
    );
    let uid_on_tcp = load(
        "[[access]]\ncaller = \"uid:0\"\nservices = [\"approvals\"]\n",
        &[],
    )
    .unwrap_err();
    assert!(matches!(
        uid_on_tcp,
        ConfigError::Invalid {
            key: "access.caller",
            ..
        }
    ));
    let unknown_service = load(
        "listen = \"unix:/tmp/tg.sock\"\n[[access]]\ncaller = \"uid:0\"\nservices = [\"admin\"]\n",
        &[],
    )
    .unwrap_err();
    assert!(
        matches!(
            unknown_service,
            ConfigError::Invalid {
                key: "access.services",
                ..
            }
        ),
        "{unknown_service}"
    );
    let ok = load(
        "listen = \"unix:/tmp/tg.sock\"\nunix_socket_mode = \"0660\"\n[[access]]\ncaller = \"uid:1000\"\nservices = [\"authorization\", \"ledger\"]\ntenants = [\"acme\"]\n",
        &[],
    )
    .unwrap();
    assert_eq!(ok.unix_socket_mode, 0o660);
    assert!(matches!(ok.access, AccessPolicy::Grants(ref g) if g.len() == 1));
    let world = load("listen = \"unix:/tmp/tg.sock\"\nunix_socket_mode = \"0666\"\n[[access]]\ncaller = \"any\"\nservices = [\"authorization\"]\ntenants = [\"*\"]\n", &[]).unwrap_err();
    assert!(matches!(
        world,
        ConfigError::Invalid {
            key: "unix_socket_mode",
            ..
        }
    ));
}

#[test]
fn rate_limits_audit_and_identity_are_validated() {
    let two_rates = load(
        "[rate_limits.tenant]\nper_second = 1\nper_minute = 1\n",
        &[],
    )
    .unwrap_err();
    assert!(matches!(
        two_rates,
        ConfigError::Invalid {
            key: "rate_limits.tenant",
            ..
        }
    ));
    let zero = load("[rate_limits.tools.refund_order]\nper_minute = 0\n", &[]).unwrap_err();
    assert!(matches!(
        zero,
        ConfigError::Invalid {
            key: "rate_limits.tools",
            ..
        }
    ));
    let c = load("[rate_limits.tools.refund_order]\nper_minute = 10\nburst = 2\n[audit]\nsink = \"file:/var/log/tg.jsonl\"\nwhen_full = \"drop\"\n", &[]).unwrap();
    let refund = c.rate_limits.tools["refund_order"];
    assert_eq!(
        (refund.calls.get(), refund.period, refund.burst.get()),
        (10, Duration::from_secs(60), 2)
    );
    assert_eq!(c.audit.sink, AuditSink::File("/var/log/tg.jsonl".into()));
    assert_eq!(c.audit.when_full, WhenFull::Drop);
    let no_keys = load("require_identity_token = true\n", &[]).unwrap_err();
    assert!(matches!(
        no_keys,
        ConfigError::Invalid {
            key: "require_identity_token",
            ..
        }
    ));
    let star = load("[grpc_web]\nallowed_origins = [\"*\"]\n", &[]).unwrap_err();
    assert!(matches!(
        star,
        ConfigError::Invalid {
            key: "grpc_web.allowed_origins",
            ..
        }
    ));
}

/// A grant that lets its caller decide or record executions names the
/// tenants it may act for; approvers' grants need none.
#[test]
fn executor_grants_name_their_tenants() {
    let uds = "listen = \"unix:/tmp/tg.sock\"\n[[access]]\ncaller = \"uid:1000\"\n";
    for services in [
        "[\"authorization\"]",
        "[\"ledger\"]",
        "[\"approvals\", \"ledger\"]",
        "[\"entities\"]",
    ] {
        let err = load(&format!("{uds}services = {services}\n"), &[]).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Invalid {
                    key: "access.tenants",
                    ..
                }
            ),
            "{services}: {err}"
        );
        assert!(err.to_string().contains("uid:1000"), "{err}");
    }
    for tenants in ["[]", "[\"\"]"] {
        let err = load(
            &format!("{uds}services = [\"authorization\"]\ntenants = {tenants}\n"),
            &[],
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Invalid {
                    key: "access.tenants",
                    ..
                }
            ),
            "{tenants}: {err}"
        );
    }
    let tenants_of = |text: &str| {
        let c = load(&format!("{uds}{text}"), &[]).unwrap();
        let AccessPolicy::Grants(grants) = c.access else {
            panic!("grants were configured");
        };
        grants.into_iter().map(|g| g.tenants).collect::<Vec<_>>()
    };
    assert_eq!(
        tenants_of(
            "services = [\"authorization\", \"ledger\"]\ntenants = [\"acme\", \"globex\"]\n"
        ),
        vec![TenantScope::of(["acme", "globex"])]
    );
    assert_eq!(
        tenants_of("services = [\"ledger\"]\ntenants = [\"*\"]\n"),
        vec![TenantScope::Any]
    );
    // An approver's tenant is its verified token's: the grant names none.
    assert_eq!(
        tenants_of("services = [\"approvals\", \"policy\"]\n"),
        vec![TenantScope::default()]
    );
}

/// The shipped, documented example loads as it is.
#[test]
fn the_example_configuration_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("toolgate.example.toml");
    let c = Config::load_with_env(Some(&path), &[], Overrides::default()).unwrap();
    let AccessPolicy::Grants(grants) = &c.access else {
        panic!("the example has grants");
    };
    let services = |caller: &str| {
        grants
            .iter()
            .find(|g| g.caller == CallerPattern::parse(caller).unwrap())
            .map(|g| g.services.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    };
    assert_eq!(
        services("san:spiffe://acme.example/ns/agents/sa/executor"),
        Some(vec!["authorization", "ledger"])
    );
    let executor = grants
        .iter()
        .find(|g| g.services.contains(&ServiceName::Ledger))
        .map(|g| g.tenants.clone());
    assert_eq!(executor, Some(TenantScope::of(["acme"])));
    assert_eq!(services("cn:approval-ui"), Some(vec!["approvals"]));
    let sync = grants
        .iter()
        .find(|g| g.services.contains(&ServiceName::Entities))
        .map(|g| (g.services.len(), g.tenants.clone()));
    assert_eq!(sync, Some((1, TenantScope::of(["acme"]))));
    assert!(c.tls.as_ref().is_some_and(|t| t.client_ca.is_some()));
    assert!(c.require_identity_token);
    assert!(c.metrics_listen.is_some());
    assert_eq!(c.approver_audience.as_deref(), Some("toolgate-approvals"));
    assert_eq!(
        c.jwks_remote.map(|r| r.location),
        Some(crate::identity::JwksLocation::Url(
            "https://idp.acme.example/.well-known/jwks.json".into()
        ))
    );
    assert_eq!(c.max_watches_per_caller, 16);
}

/// `[identity]`'s key source and approver audience, `[limits]
/// max_watches_per_caller` and `[store] ca_file`: each checked, the key
/// named.
#[test]
fn key_sources_audiences_watch_caps_and_store_ca_files_are_checked() {
    let error = |text: &str| load(text, &[]).unwrap_err().to_string();
    let c = load(
        "issuer = \"https://idp.test\"\n[identity]\ndiscovery = true\njwks_refresh_min_seconds = 5\n",
        &[],
    )
    .unwrap();
    let remote = c.jwks_remote.unwrap();
    assert_eq!(
        remote.location,
        crate::identity::JwksLocation::Discovery {
            issuer: "https://idp.test".into()
        }
    );
    assert_eq!(remote.min_refresh, Duration::from_secs(5));
    assert_eq!(remote.max_refresh, Duration::from_secs(3600));
    assert_eq!(
        error("[identity]\njwks_url = \"https://idp.test/jwks\"\n"),
        "invalid `issuer`: is required whenever identity tokens are verified (`jwks_file`, \
         `[identity] jwks_url` or `discovery`): the issuer's tokens alone are accepted"
    );
    assert_eq!(
        error("[identity]\ndiscovery = true\n"),
        "invalid `identity.discovery`: needs `issuer` to discover from"
    );
    assert_eq!(
        error(
            "issuer = \"i\"\njwks_file = \"k.json\"\n[identity]\njwks_url = \"https://i/jwks\"\n"
        ),
        "invalid `jwks_file`: give either `jwks_file` or `[identity] jwks_url`/`discovery`, not both"
    );
    assert_eq!(
        error(
            "issuer = \"i\"\n[identity]\njwks_url = \"https://i/j\"\njwks_refresh_min_seconds = 100\njwks_refresh_max_seconds = 10\n"
        ),
        "invalid `identity.jwks_refresh_max_seconds`: must not be less than `jwks_refresh_min_seconds`"
    );
    assert_eq!(
        error("audience = \"toolgate\"\n[identity]\napprover_audience = \"toolgate\"\n"),
        "invalid `identity.approver_audience`: must differ from `audience`: the point is that a \
         token an executor forwards cannot decide approvals"
    );
    assert_eq!(
        error("[limits]\nmax_watches_per_caller = 0\n"),
        "invalid `limits.max_watches_per_caller`: must be positive"
    );
    let c = load(
        "[store]\nurl = \"postgres://u@h/db?sslmode=verify-full\"\nca_file = \"/etc/ca dir/ca.pem\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(
        c.store,
        "postgres://u@h/db?sslmode=verify-full&sslrootcert=/etc/ca%20dir/ca.pem"
    );
    let c = load(
        "[store]\nurl = \"postgres://u@h/db?sslrootcert=/a.pem\"\nca_file = \"/b.pem\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.store, "postgres://u@h/db?sslrootcert=/a.pem");
    assert_eq!(
        error("[store]\nurl = \"sqlite://x.db\"\nca_file = \"/b.pem\"\n"),
        "invalid `store.ca_file`: is for a postgres:// store (TLS to PostgreSQL)"
    );
}

/// The caps on pending approvals default to 100 per subject and 1000 per
/// tenant, are set in `[decisions]`, and must be positive.
#[test]
fn pending_approval_caps_are_configurable_and_positive() {
    let c = Config::from_raw(RawConfig::default(), Overrides::default()).unwrap();
    assert_eq!(
        c.authorizer.pending_limits,
        crate::approvals::PendingLimits {
            per_subject: 100,
            per_tenant: 1000
        }
    );
    let c = load(
        "[decisions]\nmax_pending_approvals_per_subject = 3\nmax_pending_approvals_per_tenant = 7\n",
        &[],
    )
    .unwrap();
    assert_eq!(
        c.authorizer.pending_limits,
        crate::approvals::PendingLimits {
            per_subject: 3,
            per_tenant: 7
        }
    );
    for key in [
        "max_pending_approvals_per_subject",
        "max_pending_approvals_per_tenant",
    ] {
        match load(&format!("[decisions]\n{key} = 0\n"), &[]) {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, format!("decisions.{key}")),
            other => panic!("{key}: {other:?}"),
        }
    }
}

/// `[authzen]`: no default tenant unless set, each pointer movable and
/// checked, the URLs and caps validated, the environment as for any key.
#[test]
fn the_authzen_section_moves_pointers_and_is_validated() {
    let c = load("", &[]).unwrap();
    assert_eq!(c.authzen, crate::authzen::AuthzenConfig::default());
    assert_eq!(c.authzen.default_tenant, None);
    let c = load(
        "[authzen]\ntenant = \"/context/tenant\"\narguments = [\"/context/args\"]\n\
         identity_token_header = \"X-User-Token\"\n\
         access_request_endpoint = \"https://access.example.com/requests\"\n",
        &[("TOOLGATE_AUTHZEN__DEFAULT_TENANT", "acme")],
    )
    .unwrap();
    assert_eq!(c.authzen.default_tenant.as_deref(), Some("acme"));
    assert_eq!(c.authzen.tenant, "/context/tenant");
    assert_eq!(c.authzen.arguments, ["/context/args"]);
    assert_eq!(c.authzen.identity_token_header, "x-user-token");
    assert_eq!(
        c.authzen.access_request_endpoint.as_deref(),
        Some("https://access.example.com/requests")
    );
    for (text, message) in [
        (
            "[authzen]\ntenant = \"tenant\"\n",
            "invalid `authzen.tenant`: `tenant` is not a JSON pointer below `/subject`, `/resource`, `/action` or `/context`",
        ),
        (
            "[authzen]\nrequest_id = []\n",
            "invalid `authzen.request_id`: names no pointer",
        ),
        (
            "[authzen]\ndefault_tenant = \"\"\n",
            "invalid `authzen.default_tenant`: must not be empty (leave it unset to refuse requests without a tenant)",
        ),
        (
            "[authzen]\npolicy_decision_point = \"https://pdp.example.com/?x=1\"\n",
            "invalid `authzen.policy_decision_point`: `https://pdp.example.com/?x=1` is not an https URL without query or fragment",
        ),
        (
            "[authzen]\nmax_evaluations = 0\n",
            "invalid `authzen.max_evaluations`: must be positive",
        ),
    ] {
        assert_eq!(load(text, &[]).unwrap_err().to_string(), message, "{text}");
    }
    let typo = load("[authzen]\ndefault_tenent = \"acme\"\n", &[]).unwrap_err();
    assert!(
        typo.to_string().contains("unknown field `default_tenent`"),
        "{typo}"
    );
}

/// `[ext_authz]`: nothing denied and `authorization` by default; the
/// methods, the header (lower case) and the cap validated.
#[test]
fn the_ext_authz_section_is_read_and_validated() {
    let c = load("", &[]).unwrap();
    assert_eq!(c.ext_authz, crate::ext_authz::ExtAuthzConfig::default());
    let c = load(
        "[ext_authz]\ndenied_methods = [\"sampling/createMessage\"]\n\
         identity_header = \"X-Forwarded-Access-Token\"\nmax_body_bytes = 4096\n",
        &[],
    )
    .unwrap();
    assert_eq!(c.ext_authz.denied_methods, ["sampling/createMessage"]);
    assert_eq!(c.ext_authz.identity_header, "x-forwarded-access-token");
    assert_eq!(c.ext_authz.max_body_bytes, 4096);
    for (text, message) in [
        (
            "[ext_authz]\ndenied_methods = [\"tools/call\"]\n",
            "invalid `ext_authz.denied_methods`: `tools/call` is decided by policy, not denied wholesale",
        ),
        (
            "[ext_authz]\ndenied_methods = [\"\"]\n",
            "invalid `ext_authz.denied_methods`: names an empty method",
        ),
        (
            "[ext_authz]\nidentity_header = \"bad header\"\n",
            "invalid `ext_authz.identity_header`: `bad header` is not a header name",
        ),
        (
            "[ext_authz]\nmax_body_bytes = 0\n",
            "invalid `ext_authz.max_body_bytes`: must be positive",
        ),
    ] {
        assert_eq!(load(text, &[]).unwrap_err().to_string(), message, "{text}");
    }
}

/// `[console]`: off by default, oauth2-proxy's header unless another is
/// named (lowercased), the environment as for any key.
#[test]
fn the_console_section_is_off_by_default_and_validated() {
    let c = load("", &[]).unwrap();
    assert_eq!(
        c.console,
        crate::console::ConsoleConfig {
            enabled: false,
            token_header: "x-forwarded-access-token".into()
        }
    );
    let c = load(
        "[console]\nenabled = true\ntoken_header = \"Authorization\"\n",
        &[],
    )
    .unwrap();
    assert!(c.console.enabled);
    assert_eq!(c.console.token_header, "authorization");
    let c = load("", &[("TOOLGATE_CONSOLE__ENABLED", "true")]).unwrap();
    assert!(c.console.enabled);
    assert_eq!(
        load("[console]\ntoken_header = \"x token\"\n", &[])
            .unwrap_err()
            .to_string(),
        "invalid `console.token_header`: `x token` is not a header name"
    );
    let typo = load("[console]\nenable = true\n", &[]).unwrap_err();
    assert!(
        typo.to_string().contains("unknown field `enable`"),
        "{typo}"
    );
}
