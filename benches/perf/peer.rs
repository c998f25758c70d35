//! The peer: permitio/cedar-agent, a naive Cedar sidecar (HTTP/1.1 and
//! JSON, Cedar 2.4), installed from crates.io by the suite itself, started
//! on a free loopback port at `--log-level error`, and fed the example
//! deployment's policies and static entities over its API (`PUT
//! /v1/policies`, `PUT /v1/data`). Each call (`POST /v1/is_authorized`)
//! carries what toolgate's `Authorize` carries: the caller as the principal
//! entity, the executor's order entity and the same context.
//!
//! Cedar 2.4 has no `is` operator; the policies go to the peer with each
//! `is T` scope constraint dropped (`resource is Order` → `resource`,
//! `resource is Order in X` → `resource in X`) and without annotations,
//! under the ids the raw floor gives them. For the suite's call that
//! decides the same, and every answer is checked against the raw floor's
//! decision and determining policies.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::net::TcpStream;

use super::BoxError;
use super::common::ChildGuard;

/// The crate and version installed: pinned, so that two runs compare the
/// same peer.
pub const CRATE: &str = "cedar-agent";
pub const VERSION: &str = "0.2.0";
/// Where the peer is installed (`cargo install --root`), default
/// `target/perf-peer`: outside the repository's own build.
pub const ROOT_VAR: &str = "TOOLGATE_PERF_PEER_ROOT";

/// The installed peer.
pub struct Installed {
    pub binary: PathBuf,
    /// Whether this run installed it (false: it was already there).
    pub installed_now: bool,
    /// What `cedar-agent --version` says.
    pub version: String,
}

/// The peer's binary, installed with `cargo install` first when it is not
/// there yet.
///
/// # Errors
/// When the install fails or the binary does not run: the suite stops,
/// naming the command.
pub fn install() -> Result<Installed, BoxError> {
    let root = std::env::var_os(ROOT_VAR).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/perf-peer"),
        PathBuf::from,
    );
    let binary = root.join("bin").join(CRATE);
    let installed_now = !binary.is_file();
    if installed_now {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let command = format!(
            "cargo install {CRATE} --version {VERSION} --locked --root {}",
            root.display()
        );
        println!("installing the peer: {command}");
        // Outside the repository, so that its toolchain file and target
        // directory are not the peer's.
        let status = Command::new(cargo)
            .args(["install", CRATE, "--version", VERSION, "--locked", "--root"])
            .arg(&root)
            .current_dir(std::env::temp_dir())
            .env_remove("CARGO_TARGET_DIR")
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("the peer's install `{command}` did not start: {e}"))?;
        if !status.success() {
            return Err(format!("the peer's install `{command}` failed: {status}").into());
        }
        if !binary.is_file() {
            return Err(format!(
                "the peer's install `{command}` left no `{}`",
                binary.display()
            )
            .into());
        }
    }
    let out = Command::new(&binary)
        .arg("--version")
        .env_clear()
        .output()
        .map_err(|e| format!("the peer `{}` does not run: {e}", binary.display()))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || !version.contains(VERSION) {
        return Err(format!(
            "the peer `{}` is not {CRATE} {VERSION}: `{version}` ({}); remove it to reinstall",
            binary.display(),
            out.status
        )
        .into());
    }
    Ok(Installed {
        binary,
        installed_now,
        version,
    })
}

/// A free port on loopback (bound, read and released: cedar-agent takes a
/// port number and never says which port it bound).
fn free_port() -> Result<u16, BoxError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The running peer, killed when dropped.
pub struct Running {
    pub guard: ChildGuard,
    pub addr: SocketAddr,
}

/// Starts the peer on a free loopback port at `--log-level error`, in
/// `dir` (no `Rocket.toml` there) with an empty environment (cedar-agent
/// lets its environment override its flags), and waits until it answers.
///
/// # Errors
/// When it exits or does not answer in 30 s.
pub async fn start(binary: &Path, dir: &Path) -> Result<Running, BoxError> {
    let mut last = String::new();
    // A port found free may be taken before the peer binds it: a few tries.
    for _ in 0..5 {
        let port = free_port()?;
        let log = dir.join("cedar-agent.log");
        let child = Command::new(binary)
            .args(["--addr", "127.0.0.1", "--port", &port.to_string()])
            .args(["--log-level", "error"])
            .current_dir(dir)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let mut guard = ChildGuard(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = guard.0.try_wait()? {
                last = format!(
                    "{CRATE} exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default().trim()
                );
                break;
            }
            if let Ok(mut conn) = Http1::connect(addr).await
                && let Ok((204, _)) = conn.send(http::Method::GET, "/v1/", None).await
            {
                return Ok(Running { guard, addr });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if guard.0.try_wait()?.is_none() {
            return Err(format!("{CRATE} did not answer on {addr} in 30 s").into());
        }
    }
    Err(format!("{CRATE} did not start: {last}").into())
}

/// One HTTP/1.1 keep-alive connection.
pub struct Http1 {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    host: String,
    last_used: Instant,
}

/// How long a connection may sit unused before [`Http1::refresh`] replaces
/// it: well under Rocket's keep-alive timeout (5 s), after which
/// cedar-agent closes it, and a request sent just then would fail.
const IDLE: Duration = Duration::from_secs(2);

impl Http1 {
    pub async fn connect(addr: SocketAddr) -> Result<Self, BoxError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        Ok(Self {
            sender,
            addr,
            host: addr.to_string(),
            last_used: Instant::now(),
        })
    }

    /// Replaces the connection when it is closed or has been unused for
    /// [`IDLE`]: called between measured windows, so that no window pays
    /// for a reconnection or meets a connection the server is closing.
    pub async fn refresh(&mut self) -> Result<(), BoxError> {
        if self.sender.is_closed() || self.last_used.elapsed() > IDLE {
            *self = Self::connect(self.addr).await?;
        }
        Ok(())
    }

    /// One request; the status and the whole body.
    pub async fn send(
        &mut self,
        method: http::Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<(u16, Bytes), BoxError> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, &self.host);
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(body.unwrap_or_default()))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await?.to_bytes();
        self.last_used = Instant::now();
        Ok((status, bytes))
    }
}

/// Cedar 4 policy text → the policies as cedar-agent 0.2 (Cedar 2.4) takes
/// them: `[{"id", "content"}]`, one policy each, under the ids `set` gives
/// them, `is` scope constraints dropped and annotations removed.
pub fn policies_for_peer(set: &cedar_policy::PolicySet) -> Result<Value, BoxError> {
    let mut out = Vec::new();
    for policy in set.policies() {
        let mut est = policy.to_json()?;
        if let Some(map) = est.as_object_mut() {
            map.remove("annotations");
            for slot in ["principal", "resource"] {
                if let Some(scope) = map.get_mut(slot) {
                    drop_is(scope);
                }
            }
        }
        let translated = cedar_policy::Policy::from_json(Some(policy.id().clone()), est)?;
        let content = translated
            .to_cedar()
            .ok_or_else(|| format!("policy `{}` has no Cedar text", policy.id()))?;
        out.push(json!({"id": policy.id().to_string(), "content": content}));
    }
    Ok(Value::Array(out))
}

/// `{"op": "is", "entity_type": T}` → `{"op": "All"}`; with `"in"` →
/// `{"op": "in", …}`.
fn drop_is(scope: &mut Value) {
    if scope.get("op").and_then(Value::as_str) != Some("is") {
        return;
    }
    *scope = match scope.get("in") {
        Some(Value::Object(within)) => {
            let mut c = within.clone();
            c.insert("op".into(), json!("in"));
            Value::Object(c)
        }
        _ => json!({"op": "All"}),
    };
}

/// Loads `policies` and `entities` into the running peer.
///
/// # Errors
/// When the peer refuses either (its answer is in the error).
pub async fn feed(addr: SocketAddr, policies: &Value, entities: &Value) -> Result<(), BoxError> {
    let mut conn = Http1::connect(addr).await?;
    for (path, body) in [("/v1/policies", policies), ("/v1/data", entities)] {
        let (status, answer) = conn
            .send(
                http::Method::PUT,
                path,
                Some(Bytes::from(serde_json::to_vec(body)?)),
            )
            .await?;
        let stored = serde_json::from_slice::<Value>(&answer)
            .ok()
            .and_then(|v| v.as_array().map(Vec::len));
        if status != 200 || stored != body.as_array().map(Vec::len) {
            return Err(format!(
                "{CRATE} refused `PUT {path}`: {status} {}",
                String::from_utf8_lossy(&answer)
            )
            .into());
        }
    }
    Ok(())
}

/// Checks one `is_authorized` answer: `Allow`, no errors, and exactly the
/// determining policies `reasons`.
pub fn check_answer(status: u16, body: &[u8], reasons: &[String]) -> Result<(), BoxError> {
    let answer: Value = serde_json::from_slice(body)
        .map_err(|e| format!("{CRATE} answered {status} with no JSON ({e})"))?;
    let mut got: Vec<String> = answer
        .pointer("/diagnostics/reason")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    got.sort();
    let errors = answer
        .pointer("/diagnostics/errors")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if status != 200
        || answer.get("decision").and_then(Value::as_str) != Some("Allow")
        || errors != 0
        || got != reasons
    {
        return Err(format!(
            "{CRATE} did not allow as the raw floor does ({reasons:?}): {status} {answer}"
        )
        .into());
    }
    Ok(())
}
