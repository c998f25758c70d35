//! What the benchmarks share: the real `toolgate serve` binary as a child
//! process, killed when its guard is dropped; a fresh store for it; the
//! latency statistics.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A child process, killed and reaped when dropped.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The example deployment shipped in `policies/`.
pub fn example_policies() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies")
}

/// Starts the real sidecar with the example policies on `store` (a store
/// URL) and returns it with the address it logged.
#[allow(dead_code, reason = "the gateway bench passes arguments of its own")]
pub fn start_sidecar(store: &str) -> Result<(ChildGuard, SocketAddr), BoxError> {
    start_sidecar_with(store, &[])
}

/// [`start_sidecar`] with `extra` arguments to `toolgate serve`.
pub fn start_sidecar_with(
    store: &str,
    extra: &[&str],
) -> Result<(ChildGuard, SocketAddr), BoxError> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .arg("serve")
        .arg("--policies")
        .arg(example_policies())
        .args(["--listen", "127.0.0.1:0", "--store", store])
        .args(extra)
        .env("RUST_LOG", "info")
        // The perf suite's own variable, which the sidecar would refuse as
        // an unknown `TOOLGATE_*` key.
        .env_remove("TOOLGATE_PERF_PEER_ROOT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let guard = ChildGuard(child);
    let (tx, rx) = std::sync::mpsc::channel();
    // Drains the log (the audit events) for the sidecar's whole life.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let listen = serde_json::from_str::<Value>(&line).ok().and_then(|v| {
                v.get("fields")
                    .and_then(|f| f.get("listen"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            });
            if let Some(listen) = listen {
                let _ = tx.send(listen);
            }
        }
    });
    let listen = rx.recv_timeout(Duration::from_secs(60))?;
    Ok((guard, listen.parse()?))
}

/// A fresh store for one sidecar, removed when dropped: a SQLite file in a
/// temporary directory, or a throwaway schema on a PostgreSQL server.
#[allow(dead_code, reason = "not every bench runs the ledger")]
pub enum FreshStore {
    Sqlite {
        url: String,
        _dir: tempfile::TempDir,
    },
    Postgres(toolgate::store::scratch::ScratchSchema),
}

#[allow(dead_code, reason = "not every bench runs the ledger")]
impl FreshStore {
    /// A new SQLite file.
    pub fn sqlite() -> Result<Self, BoxError> {
        let dir = tempfile::tempdir()?;
        let url = format!("sqlite://{}", dir.path().join("bench.db").display());
        Ok(Self::Sqlite { url, _dir: dir })
    }

    /// A new schema on the PostgreSQL server `admin_url` names.
    pub async fn postgres(admin_url: &str) -> Result<Self, BoxError> {
        Ok(Self::Postgres(
            toolgate::store::scratch::ScratchSchema::create(admin_url).await?,
        ))
    }

    /// The store URL for `toolgate serve --store`.
    pub fn url(&self) -> &str {
        match self {
            Self::Sqlite { url, .. } => url,
            Self::Postgres(schema) => schema.url(),
        }
    }

    /// `sqlite` or `postgres`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sqlite { .. } => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }
}

/// The sidecar's own wiring (`toolgate::server`), in process: the policy
/// set `policies` already loaded, an in-memory SQLite store and the audit
/// log discarded by name — what a decision costs without the transport.
#[allow(dead_code, reason = "not every bench decides in process")]
pub async fn in_process(
    policies: std::sync::Arc<toolgate::policy::PolicyReloader>,
) -> Result<toolgate::server::Services, BoxError> {
    let mut config = toolgate::config::Config::with_defaults(toolgate::config::Overrides {
        policies: Some(policies.dir().to_path_buf()),
        store: Some(":memory:".into()),
        ..toolgate::config::Overrides::default()
    })?;
    config.audit.sink = toolgate::audit::AuditSink::Discard;
    let clock = std::sync::Arc::new(toolgate::clock::SystemClock);
    Ok(toolgate::server::assemble(&config, clock, policies).await?)
}

/// Loads `dir` as the sidecar does.
#[allow(dead_code, reason = "not every bench decides in process")]
pub fn load_policies(
    dir: &std::path::Path,
) -> Result<std::sync::Arc<toolgate::policy::PolicyReloader>, BoxError> {
    let clock = std::sync::Arc::new(toolgate::clock::SystemClock);
    let reloader =
        toolgate::policy::PolicyReloader::load(dir, clock).map_err(|e| format!("{e:?}"))?;
    Ok(std::sync::Arc::new(reloader))
}

/// Latencies of one side of one round.
#[allow(dead_code, reason = "not every bench measures a load")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub p50_us: f64,
    pub p99_us: f64,
    pub rps: f64,
}

/// The p50, p99 and rate of one side's latencies over `elapsed`.
#[allow(dead_code, reason = "not every bench measures a load")]
pub fn summarize(mut latencies: Vec<Duration>, elapsed: Duration) -> Summary {
    latencies.sort_unstable();
    let pick = |q: f64| {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "an index into a sample of at most millions"
        )]
        let i = ((latencies.len().saturating_sub(1)) as f64 * q).round() as usize;
        latencies.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    #[allow(clippy::cast_precision_loss, reason = "a count of requests")]
    let rps = latencies.len() as f64 / elapsed.as_secs_f64().max(1e-9);
    Summary {
        p50_us: pick(0.50),
        p99_us: pick(0.99),
        rps,
    }
}

/// The median (0 for none).
#[allow(dead_code, reason = "not every bench measures a load")]
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    let mid = n / 2;
    let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
    if n % 2 == 1 {
        at(mid)
    } else {
        f64::midpoint(at(mid - 1), at(mid))
    }
}

/// The medians over rounds of one side.
#[allow(dead_code, reason = "not every bench measures a load")]
pub fn medians(rounds: &[Summary]) -> Summary {
    Summary {
        p50_us: median(rounds.iter().map(|s| s.p50_us).collect()),
        p99_us: median(rounds.iter().map(|s| s.p99_us).collect()),
        rps: median(rounds.iter().map(|s| s.rps).collect()),
    }
}
