//! Issue 18 point 6, TLS to PostgreSQL (rustls), against a real `toolgate
//! serve` and a private PostgreSQL cluster this test starts on a free
//! loopback port with a certificate it makes: `sslmode=require` and
//! `verify-full` (a CA file in the URL's `sslrootcert` or `[store]
//! ca_file`) connect to a `hostssl`-only server; `verify-full` with a
//! wrong CA or to a host the certificate does not name stops the start
//! with a clear error (fail closed); plaintext is refused by the
//! `hostssl`-only server; and `verify-full` refuses a server that offers
//! no TLS.
//!
//! The machine's own server (127.0.0.1:5432) has no TLS, so the cluster is
//! private: `initdb` and `pg_ctl` from `/usr/lib/postgresql/*/bin`, run as
//! the `postgres` user when the test runs as root (initdb refuses root),
//! stopped and removed at the end. Without those binaries the test fails
//! (or, where skips are allowed, records its skip).
//!
//! On main at ab769e4 this fails: any `sslmode` but disable/prefer is
//! refused ("this build connects without TLS"), and `[store] ca_file` is
//! an unknown key.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::listeners::Pki;
use crate::sidecar::{Sidecar, toolgate};

/// A PostgreSQL cluster of this test's own; stopped (and its files
/// removed) when dropped.
struct PrivateCluster {
    bin: PathBuf,
    /// Owns the data folder, the log and the socket.
    dir: tempfile::TempDir,
    port: u16,
}

/// The server binaries' folder, if PostgreSQL is installed.
fn server_binaries() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
        .collect();
    found.sort();
    found.pop()
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program args…`, as the `postgres` user when this test runs as root;
/// bounded by `pg_ctl`'s own `-t` where it waits.
fn run(program: &Path, args: &[&str]) -> std::process::Output {
    let mut command = if running_as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    command
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()))
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl PrivateCluster {
    /// Initializes and starts a cluster with TLS on (`cert`/`key` PEM) that
    /// takes loopback TCP connections over TLS only (`hostssl`; plaintext
    /// is rejected), trusting every user: a throwaway.
    fn start(cert: &str, key: &str) -> Option<Self> {
        let Some(bin) = server_binaries() else {
            crate::prerequisites::skip_or_fail(
                "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin",
                "install the PostgreSQL server (Debian: apt-get install postgresql)",
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        if running_as_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "chown of the cluster's folder failed");
        }
        let data = dir.path().join("data");
        let data_arg = data.to_str().unwrap();
        let out = run(
            &bin.join("initdb"),
            &["-D", data_arg, "-U", "postgres", "-A", "trust", "--no-sync"],
        );
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The key and certificate inside the data folder, the server's own.
        std::fs::write(data.join("server.crt"), cert).unwrap();
        std::fs::write(data.join("server.key"), key).unwrap();
        let port = free_port();
        let conf = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nfsync = off\n",
            dir.path().display()
        );
        append(&data.join("postgresql.conf"), &conf);
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n\
             hostnossl all all 127.0.0.1/32 reject\n",
        )
        .unwrap();
        if running_as_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&data)
                .status()
                .unwrap();
            assert!(status.success());
        }
        let mut permissions = std::fs::metadata(data.join("server.key"))
            .unwrap()
            .permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o600);
        std::fs::set_permissions(data.join("server.key"), permissions).unwrap();
        let cluster = Self { bin, dir, port };
        let log = cluster.dir.path().join("server.log");
        let out = run(
            &cluster.bin.join("pg_ctl"),
            &[
                "start",
                "-D",
                data_arg,
                "-w",
                "-t",
                "60",
                "-l",
                log.to_str().unwrap(),
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Some(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The cluster's URL for `host`, with `query` (`sslmode=…&…`).
    fn url(&self, host: &str, query: &str) -> String {
        format!("postgres://postgres@{host}:{}/postgres?{query}", self.port)
    }

    /// TLS off, plaintext allowed: a server that offers no TLS.
    fn without_tls(&self) {
        append(&self.data().join("postgresql.conf"), "\nssl = off\n");
        std::fs::write(
            self.data().join("pg_hba.conf"),
            "local all all trust\nhost all all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        let out = run(
            &self.bin.join("pg_ctl"),
            &["reload", "-D", self.data().to_str().unwrap()],
        );
        assert!(out.status.success());
        // A reload is asynchronous: wait until TLS is off (bounded).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log =
                std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
            if log.contains("reloading configuration files") || log.contains("received SIGHUP") {
                std::thread::sleep(Duration::from_millis(300));
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not reload");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = run(
            &self.bin.join("pg_ctl"),
            &[
                "stop",
                "-D",
                self.data().to_str().unwrap_or_default(),
                "-m",
                "immediate",
                "-w",
                "-t",
                "30",
            ],
        );
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

/// `toolgate serve` on `store` (and `dir/toolgate.toml`, if written) must
/// refuse to start within 30 s; its stderr.
fn refused_start(dir: &Path, store: &str) -> String {
    let mut command = toolgate();
    command
        .arg("serve")
        .arg("--policies")
        .arg(crate::support::example_policies())
        .args(["--listen", "127.0.0.1:0", "--store", store])
        .current_dir(dir);
    crate::sidecar::refused_start(command, Duration::from_secs(30))
}

/// An Authorize through a sidecar: the store answers (the call is
/// recorded there), so the connection is up.
async fn decides(sidecar: &Sidecar) {
    let r = toolgate::grpc::pb::authorization_service_client::AuthorizationServiceClient::new(
        sidecar.channel().await,
    )
    .authorize(crate::support::request(
        "get_order",
        r#"{"order_id":"ord_1001"}"#,
    ))
    .await
    .unwrap()
    .into_inner();
    assert_eq!(r.decision(), toolgate::grpc::pb::Decision::Allow, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_verifies_the_server_and_fails_closed() {
    let pki = Pki::new("toolgate test PostgreSQL CA");
    // The server's certificate names the IP address 127.0.0.1 only.
    let (cert, key) = pki.issue("postgres", &["127.0.0.1"], &[], true);
    let Some(cluster) = PrivateCluster::start(&cert, &key) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let ca = work.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let wrong_ca = work.path().join("other-ca.pem");
    std::fs::write(&wrong_ca, Pki::new("another CA").ca_pem).unwrap();
    let ca_arg = ca.to_str().unwrap();

    // require: encrypted (the server takes nothing else), not verified.
    let sidecar = Sidecar::start_with_store(
        work.path(),
        &cluster.url("127.0.0.1", "sslmode=require"),
        &[],
    );
    decides(&sidecar).await;
    drop(sidecar);

    // verify-full with the CA in the URL.
    let sidecar = Sidecar::start_with_store(
        work.path(),
        &cluster.url(
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={ca_arg}"),
        ),
        &[],
    );
    decides(&sidecar).await;
    drop(sidecar);

    // verify-full with the CA from `[store] ca_file`.
    std::fs::write(
        work.path().join("toolgate.toml"),
        format!(
            "[store]\nurl = \"{}\"\nca_file = \"{ca_arg}\"\n",
            cluster.url("127.0.0.1", "sslmode=verify-full")
        ),
    )
    .unwrap();
    let mut command = toolgate();
    command
        .arg("serve")
        .arg("--policies")
        .arg(crate::support::example_policies())
        .args(["--listen", "127.0.0.1:0"])
        .current_dir(work.path());
    let sidecar = Sidecar::spawn(command);
    decides(&sidecar).await;
    drop(sidecar);
    std::fs::remove_file(work.path().join("toolgate.toml")).unwrap();

    // A CA that did not issue the server's certificate: refused.
    let stderr = refused_start(
        work.path(),
        &cluster.url(
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={}", wrong_ca.display()),
        ),
    );
    assert!(stderr.contains("invalid peer certificate"), "{stderr}");
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");

    // A host name the certificate does not name (it names 127.0.0.1):
    // refused by verify-full, while verify-ca (the chain only) connects.
    let stderr = refused_start(
        work.path(),
        &cluster.url(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={ca_arg}"),
        ),
    );
    assert!(stderr.contains("invalid peer certificate"), "{stderr}");
    assert!(
        stderr.contains("certificate not valid for name \"localhost\""),
        "{stderr}"
    );
    let sidecar = Sidecar::start_with_store(
        work.path(),
        &cluster.url(
            "localhost",
            &format!("sslmode=verify-ca&sslrootcert={ca_arg}"),
        ),
        &[],
    );
    decides(&sidecar).await;
    drop(sidecar);

    // Plaintext: the hostssl-only server refuses it.
    let stderr = refused_start(work.path(), &cluster.url("127.0.0.1", "sslmode=disable"));
    assert!(stderr.contains("no encryption"), "{stderr}");

    // A server that offers no TLS: verify-full refuses to talk plaintext.
    cluster.without_tls();
    let stderr = refused_start(
        work.path(),
        &cluster.url(
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={ca_arg}"),
        ),
    );
    assert!(stderr.contains("server does not support TLS"), "{stderr}");
    // …while plaintext, asked for, now connects: the refusal was TLS's.
    let sidecar = Sidecar::start_with_store(
        work.path(),
        &cluster.url("127.0.0.1", "sslmode=disable"),
        &[],
    );
    decides(&sidecar).await;
    drop(sidecar);
    drop(cluster);
}
