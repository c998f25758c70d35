//! The gRPC surface: wire types ⇄ domain types, nothing more.
//!
//! This is the only module that sees tonic or prost. Handlers destructure
//! each request, call the domain, and translate the answer; executor
//! mistakes become `INVALID_ARGUMENT` with `google.rpc.BadRequest` details,
//! everything about the model's call is a normal response with an envelope.

mod approval;
mod authorization;
mod convert;
mod ledger;
mod policy;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::approval_desk::ApprovalDesk;
use crate::authorizer::ToolCallAuthorizer;
use crate::ledger_desk::LedgerDesk;
use crate::policy::{PolicyReloader, ReloadTriggers};
use crate::store::{Store, StoreError};

/// The generated wire types, private to the crate except through `pb`.
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    missing_docs,
    unreachable_pub
)]
pub mod pb {
    tonic::include_proto!("toolgate.v1");

    /// The encoded descriptor set, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/toolgate_descriptor.bin"));
}

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("the approval event relay: {0}")]
    Store(#[from] StoreError),
}

/// The domain services the gRPC surface translates for.
#[derive(Debug, Clone)]
pub struct Services {
    pub authorizer: Arc<ToolCallAuthorizer>,
    pub desk: Arc<ApprovalDesk>,
    /// How often due approvals are marked expired (and announced).
    pub expiry_interval: std::time::Duration,
    /// The execution ledger; its records past retention are collected
    /// every `collect_interval` of its configuration.
    pub ledger: Arc<LedgerDesk>,
    /// The live policy set the authorizer and the desk decide on.
    pub policies: Arc<PolicyReloader>,
    /// What reloads it while the server runs.
    pub reload: ReloadTriggers,
    /// The store the desks share: health follows it, and a shared one
    /// relays other replicas' approval events to this server's watchers.
    pub store: Arc<dyn Store>,
    /// How often health asks the store whether it answers.
    pub store_probe_interval: std::time::Duration,
}

/// Serves every toolgate service, health and reflection on `listener` until
/// `shutdown` resolves. Used by `main` and by the tests alike.
///
/// Health reports NOT_SERVING until the services are wired to a loaded
/// policy set, SERVING after; then, for the whole server and each service
/// that needs the store, NOT_SERVING while the store does not answer. The
/// policy reloader, and the relay of other replicas' approval events, run
/// for as long as the server does.
///
/// # Errors
/// [`ServeError`] when the transport fails.
pub async fn serve(
    listener: TcpListener,
    services: Services,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    use pb::approval_service_server::ApprovalServiceServer;
    use pb::authorization_service_server::AuthorizationServiceServer;
    use pb::ledger_service_server::LedgerServiceServer;
    use pb::policy_service_server::PolicyServiceServer;

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;

    let Services {
        authorizer,
        desk,
        expiry_interval,
        ledger,
        policies,
        reload,
        store,
        store_probe_interval,
    } = services;
    // Before anything is served, so no watcher subscribes before it listens.
    let relay = store
        .relay_approval_events(Arc::clone(desk.events()))
        .await?;
    let authorization = AuthorizationServiceServer::new(authorization::AuthorizationApi::new(
        authorizer,
        Arc::clone(&ledger),
    ));
    // Open watch streams would hold a graceful shutdown forever: they end
    // (with UNAVAILABLE, so clients watch again elsewhere) once it starts.
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = stopping_tx.send(true);
    };
    let approvals = ApprovalServiceServer::new(approval::ApprovalApi::new(
        Arc::clone(&desk),
        stopping.clone(),
    ));
    // Expiry needs nobody to ask: a background sweep, stopped with the server.
    let sweeper = tokio::spawn(async move {
        let mut tick = tokio::time::interval(expiry_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = desk.expire_due().await {
                tracing::error!(error = %e, "approval expiry sweep failed");
            }
        }
    });
    // Retention likewise; each batch is its own short transaction.
    let collector = {
        let ledger = Arc::clone(&ledger);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(ledger.config().collect_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = ledger.collect_due().await {
                    tracing::error!(error = %e, "ledger retention sweep failed");
                }
            }
        })
    };
    let ledger = LedgerServiceServer::new(ledger::LedgerApi::new(ledger));
    let policy = PolicyServiceServer::new(policy::PolicyApi::new(Arc::clone(&policies)));
    // Reloads need nobody to ask either; the watch stops with the server.
    let reloads = tokio::spawn(crate::policy::start_reloads(policies, reload));

    // The policy set is loaded before the authorizer exists, so the
    // services are ready as soon as they are wired.
    reporter
        .set_serving::<AuthorizationServiceServer<authorization::AuthorizationApi>>()
        .await;
    reporter
        .set_serving::<ApprovalServiceServer<approval::ApprovalApi>>()
        .await;
    reporter
        .set_serving::<LedgerServiceServer<ledger::LedgerApi>>()
        .await;
    reporter
        .set_serving::<PolicyServiceServer<policy::PolicyApi>>()
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let probe = tokio::spawn(follow_store(
        store,
        reporter.clone(),
        store_probe_interval,
        stopping,
    ));

    // TCP_NODELAY: without it a response's last frame waits for the
    // client's delayed ACK, some 40 ms on every call.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let result = Server::builder()
        .add_service(health)
        .add_service(reflection)
        .add_service(authorization)
        .add_service(approvals)
        .add_service(ledger)
        .add_service(policy)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    sweeper.abort();
    collector.abort();
    reloads.abort();
    probe.abort();
    if let Some(relay) = relay {
        relay.abort();
    }
    result?;
    Ok(())
}

/// Health follows the store: NOT_SERVING for the whole server and for each
/// service that needs the store while it does not answer, SERVING again once
/// it does; stops when the server starts shutting down.
async fn follow_store(
    store: Arc<dyn Store>,
    reporter: tonic_health::server::HealthReporter,
    every: std::time::Duration,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    use pb::approval_service_server::ApprovalServiceServer;
    use pb::authorization_service_server::AuthorizationServiceServer;
    use pb::ledger_service_server::LedgerServiceServer;
    use tonic::server::NamedService;
    use tonic_health::ServingStatus;

    let names = [
        "",
        <AuthorizationServiceServer<authorization::AuthorizationApi> as NamedService>::NAME,
        <ApprovalServiceServer<approval::ApprovalApi> as NamedService>::NAME,
        <LedgerServiceServer<ledger::LedgerApi> as NamedService>::NAME,
    ];
    let mut answering = true;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopping.wait_for(|s| *s) => return,
        }
        let result = store.ping().await;
        if *stopping.borrow() {
            return;
        }
        if result.is_ok() == answering {
            continue;
        }
        answering = result.is_ok();
        let status = match &result {
            Ok(()) => {
                tracing::info!("the store answers again: SERVING");
                ServingStatus::Serving
            }
            Err(e) => {
                tracing::error!(error = %e, "the store does not answer: NOT_SERVING");
                ServingStatus::NotServing
            }
        };
        for name in names {
            reporter.set_service_status(name, status).await;
        }
    }
}
