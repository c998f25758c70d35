//! `grpc.health.v1.Health`: tonic-health's service, except that an open
//! `Watch` stream ends once the drain is over. A load balancer watching
//! health would otherwise hold a graceful shutdown until its grace ran out:
//! the server waits for every open call, and a watch never finishes by
//! itself. Watchers see NOT_SERVING during the drain, then `UNAVAILABLE`
//! (watch again, elsewhere), and the stream ends.

use std::pin::Pin;
use std::time::Duration;

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status};
use tonic_health::pb::health_server::Health;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

use crate::metrics::Metrics;

/// How long a watcher's full queue may delay the shutdown notice.
const SHUTDOWN_NOTICE_WAIT: Duration = Duration::from_secs(1);

/// The health service of one server.
#[derive(Debug)]
pub(super) struct DrainingHealth {
    inner: HealthService,
    /// Becomes `true` when the drain is over and the server stops accepting.
    closing: watch::Receiver<bool>,
    /// One per open watch: past the listener's limit, `RESOURCE_EXHAUSTED`.
    slots: WatchSlots,
}

impl DrainingHealth {
    /// The statuses `reporter` sets, served until `closing` turns `true`,
    /// to at most as many watchers at once as `slots` holds.
    pub(super) fn new(
        reporter: &HealthReporter,
        closing: watch::Receiver<bool>,
        slots: WatchSlots,
    ) -> Self {
        Self {
            inner: HealthService::from_health_reporter(reporter.clone()),
            closing,
            slots,
        }
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for DrainingHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let slot = self.slots.take()?;
        let mut statuses = self.inner.watch(request).await?.into_inner();
        let mut closing = self.closing.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            // The slot is free again when the watch's task ends.
            let _slot = slot;
            loop {
                tokio::select! {
                    // A status already set (NOT_SERVING at the start of the
                    // drain) goes out before the end.
                    biased;
                    status = statuses.next() => {
                        let Some(status) = status else { return };
                        if tx.send(status).await.is_err() {
                            return;
                        }
                    }
                    () = tx.closed() => return,
                    () = async { let _ = closing.wait_for(|c| *c).await; } => {
                        let notice = Status::unavailable("the server is shutting down; watch again");
                        let _ = tokio::time::timeout(SHUTDOWN_NOTICE_WAIT, tx.send(Err(notice))).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Health watches open at once: a slot each, or `RESOURCE_EXHAUSTED`.
#[derive(Debug, Clone)]
pub(super) struct WatchSlots {
    slots: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

impl WatchSlots {
    pub(super) fn new(max: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max.max(1))),
            metrics,
        }
    }

    /// A slot, held for as long as the watch runs.
    pub(super) fn take(&self) -> Result<OwnedSemaphorePermit, Status> {
        Arc::clone(&self.slots).try_acquire_owned().map_err(|_| {
            self.metrics.overloaded("health_watches");
            Status::resource_exhausted(
                "the listener holds its most health watches; check instead, or watch again later",
            )
        })
    }
}
