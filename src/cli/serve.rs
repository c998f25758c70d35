//! `toolgate serve`: the sidecar, built by [`crate::server::build`] (the one
//! assembly), served until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use super::report::built;
use crate::clock::SystemClock;
use crate::config::{Config, Overrides};
use crate::server;

/// Flags of `serve`. Their environment variables (`TOOLGATE_LISTEN`, …) are
/// read by the configuration loader with every other key, so that an
/// unknown `TOOLGATE_*` variable is refused like an unknown key.
#[derive(clap::Args)]
pub(super) struct ServeArgs {
    /// The configuration file (default `./toolgate.toml` if present).
    #[arg(long, env = "TOOLGATE_CONFIG")]
    config: Option<PathBuf>,
    #[arg(long)]
    policies: Option<PathBuf>,
    /// `host:port` or `unix:/path`.
    #[arg(long)]
    listen: Option<String>,
    /// `sqlite:///path/file.db` (default `sqlite://toolgate-data/toolgate.db`)
    /// or `postgres://user@host/db` (several replicas on one database).
    #[arg(long)]
    store: Option<String>,
    #[arg(long)]
    jwks_file: Option<PathBuf>,
    #[arg(long)]
    issuer: Option<String>,
    #[arg(long)]
    audience: Option<String>,
    /// Serve Prometheus metrics on this `host:port` (a separate listener).
    #[arg(long)]
    metrics_listen: Option<String>,
}

impl ServeArgs {
    /// The configuration these flags, the file and the environment make.
    pub(super) fn load(self) -> anyhow::Result<Config> {
        let overrides = Overrides {
            policies: self.policies,
            listen: self.listen,
            store: self.store,
            jwks_file: self.jwks_file,
            issuer: self.issuer,
            audience: self.audience,
            metrics_listen: self.metrics_listen,
        };
        Ok(Config::load(self.config.as_deref(), overrides)?)
    }
}

pub(super) async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    crate::telemetry::init();
    let config = args.load()?;
    let services = built(server::build(&config, Arc::new(SystemClock)).await)?;
    let listeners = server::Listeners::bind(&config).await?;
    server::serve(services, listeners, &config, shutdown_signal()).await?;
    tracing::info!("toolgate stopped");
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
