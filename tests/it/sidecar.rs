//! The real `toolgate serve` binary as a child process, for the tests that
//! kill it with SIGKILL and start it again on the same SQLite file, and
//! those that run several replicas on one PostgreSQL database.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::example_policies;

/// The built `toolgate` binary.
pub fn toolgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
}

/// A running `toolgate serve`; killed (SIGKILL) when dropped.
pub struct Sidecar {
    child: Child,
    pub addr: SocketAddr,
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
        let mut command = toolgate();
        command
            .arg("serve")
            .arg("--policies")
            .arg(example_policies())
            .args(["--listen", "127.0.0.1:0"])
            .arg("--store")
            .arg(url)
            .args(extra)
            .current_dir(dir);
        Self::spawn(command)
    }

    /// Spawns `command` (a `toolgate serve` listening on `127.0.0.1:0`) and
    /// reads the bound address from its JSON log line `toolgate serving`
    /// (bounded: 60 s, then fail).
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the log to its end, so the child never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let listen = serde_json::from_str::<serde_json::Value>(&line)
                    .ok()
                    .and_then(|v| v["fields"]["listen"].as_str().map(str::to_owned));
                if let Some(listen) = listen {
                    let _ = tx.send(listen);
                }
            }
        });
        let listen = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("toolgate serve logged its listen address");
        Self {
            child,
            addr: listen.parse().unwrap(),
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
