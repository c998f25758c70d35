//! The real `toolgate serve` binary as a child process: the one helper of
//! every test that runs it (SIGKILL and restart on the same SQLite file,
//! several replicas on one PostgreSQL database, SIGHUP reloads, SIGTERM
//! shutdown under load).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::support::example_policies;

/// `toolgate serve` with mutual TLS (a server certificate of `pki`, client
/// certificates of `pki` required) and `config` (its `[[access]]` grants,
/// and anything else) in `dir/toolgate.toml`, with the test key set.
pub fn start_mtls(dir: &Path, pki: &crate::listeners::Pki, config: &str) -> Sidecar {
    let (cert, key) = pki.issue("toolgate", &["localhost"], &[], true);
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let (cert, key, ca) = (
        write("server.pem", &cert),
        write("server.key", &key),
        write("ca.pem", &pki.ca_pem),
    );
    write(
        "toolgate.toml",
        &format!("{config}\n[tls]\ncert = {cert:?}\nkey = {key:?}\nclient_ca = {ca:?}\n"),
    );
    Sidecar::start(dir, &crate::support::identity_args())
}

/// The built `toolgate` binary.
pub fn toolgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
}

/// Lines a child wrote, as `(stream, line)`: `("stderr", …)` or `("stdout", …)`.
pub type Kept = std::sync::Arc<std::sync::Mutex<Vec<(&'static str, String)>>>;

/// A running `toolgate serve`; killed (SIGKILL) when dropped.
pub struct Sidecar {
    child: Child,
    pub addr: SocketAddr,
    /// The metrics listener, when `--metrics-listen` (or `metrics_listen`)
    /// asked for one.
    pub metrics_addr: Option<SocketAddr>,
}

impl Sidecar {
    /// Starts the binary on `127.0.0.1:0` with the example policies and the
    /// store `dir/toolgate.db`, plus `extra` flags, and reads the bound
    /// address from its JSON log line `toolgate serving` (bounded: 60 s,
    /// then fail).
    pub fn start(dir: &Path, extra: &[OsString]) -> Self {
        let store = format!("sqlite://{}", dir.join("toolgate.db").display());
        Self::start_with_store(dir, &store, extra)
    }

    /// Like [`Self::start`], on the store `url` (and `dir/toolgate.toml`,
    /// if the test wrote one: the binary reads it from its working folder).
    pub fn start_with_store(dir: &Path, url: &str, extra: &[OsString]) -> Self {
        Self::start_serving(dir, &example_policies(), url, extra)
    }

    /// Like [`Self::start`], on the policy folder `policies`.
    pub fn start_with_policies(dir: &Path, policies: &Path, extra: &[OsString]) -> Self {
        let store = format!("sqlite://{}", dir.join("toolgate.db").display());
        Self::start_serving(dir, policies, &store, extra)
    }

    /// `toolgate serve` on `policies` and the store `url`, plus `extra` flags.
    pub fn start_serving(dir: &Path, policies: &Path, url: &str, extra: &[OsString]) -> Self {
        let mut command = toolgate();
        command
            .arg("serve")
            .arg("--policies")
            .arg(policies)
            .args(["--listen", "127.0.0.1:0"])
            .arg("--store")
            .arg(url)
            .args(extra)
            .current_dir(dir);
        Self::spawn(command)
    }

    /// Spawns `command` (a `toolgate serve` listening on `127.0.0.1:0`) and
    /// reads the bound addresses from its JSON log lines `metrics serving`
    /// and `toolgate serving`, which come in that order (bounded: 60 s,
    /// then fail).
    pub fn spawn(command: Command) -> Self {
        Self::spawn_logged(command, "info", None)
    }

    /// Like [`Self::spawn`] with `RUST_LOG=rust_log`; with `keep`, every
    /// line the process writes to stderr or stdout is appended to it, as
    /// `(stream, line)`.
    pub fn spawn_logged(mut command: Command, rust_log: &str, keep: Option<Kept>) -> Self {
        let mut child = command
            .env("RUST_LOG", rust_log)
            .stdout(if keep.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        if let (Some(stdout), Some(keep)) = (child.stdout.take(), keep.clone()) {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    keep.lock().unwrap().push(("stdout", line));
                }
            });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the log to its end, so the child never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(keep) = &keep {
                    keep.lock().unwrap().push(("stderr", line.clone()));
                }
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                for field in ["metrics_listen", "listen"] {
                    if let Some(addr) = v["fields"][field].as_str() {
                        let _ = tx.send((field, addr.to_owned()));
                    }
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut metrics_addr = None;
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(("listen", addr)) => break addr.parse().unwrap(),
                Ok((_, addr)) => metrics_addr = Some(addr.parse().unwrap()),
                Err(e) => panic!("toolgate serve logged no listen address: {e}"),
            }
        };
        Self {
            child,
            addr,
            metrics_addr,
        }
    }

    /// A new connection to the sidecar.
    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap()
    }

    /// The process id, for signals.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Sends the signal `name` (`TERM`, `HUP`, …) through `kill`.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits for the process to exit on its own, polling, for at most
    /// `within`; then kills it and fails. Blocking.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("toolgate did not exit within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no shutdown hook, no flush, no goodbye.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `command` (a `toolgate serve` whose configuration must be refused)
/// and expects it to exit with an error within `within`; its stderr.
/// Blocking.
pub fn refused_start(mut command: Command, within: Duration) -> String {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("toolgate serve started instead of refusing its configuration");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    stderr
}
