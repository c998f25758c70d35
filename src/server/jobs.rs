//! The domain's background jobs, which need nobody to ask: approval expiry,
//! ledger retention, policy reloads and the store probe. They run for as
//! long as the sidecar serves, whatever door its callers use, and stop with
//! it; a task never outlives [`Running::stop`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Services;
use crate::policy::ReloadTriggers;
use crate::store::Store;

/// How often each job runs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Schedule {
    /// How often due approvals are marked expired (and announced).
    pub approval_expiry: Duration,
    /// What reloads the policy folder.
    pub reload: ReloadTriggers,
    /// How often the store is asked whether it answers.
    pub store_probe: Duration,
}

/// The jobs of one serving sidecar.
#[derive(Debug)]
pub(super) struct Running {
    tasks: Vec<JoinHandle<()>>,
    store_health: watch::Receiver<bool>,
}

impl Running {
    /// Whether the store answers, as the probe last found (`true` at first):
    /// health follows it.
    pub fn store_health(&self) -> watch::Receiver<bool> {
        self.store_health.clone()
    }

    /// Stops every job.
    pub fn stop(self) {
        for task in self.tasks {
            task.abort();
        }
    }
}

/// Starts every job of `services`.
pub(super) fn start(services: &Services) -> Running {
    let schedule = services.jobs;
    let expiry = {
        let desk = Arc::clone(&services.approvals);
        every(schedule.approval_expiry, move || {
            let desk = Arc::clone(&desk);
            async move {
                if let Err(e) = desk.expire_due().await {
                    tracing::error!(error = %e, "approval expiry sweep failed");
                }
            }
        })
    };
    // Retention likewise; each batch is its own short transaction.
    let retention = {
        let ledger = Arc::clone(&services.ledger);
        every(ledger.config().collect_interval, move || {
            let ledger = Arc::clone(&ledger);
            async move {
                // First the operations that lapsed, so their charges are
                // released before retention looks at them.
                if let Err(e) = ledger.lapse_due().await {
                    tracing::error!(error = %e, "ledger lapse sweep failed");
                }
                if let Err(e) = ledger.collect_due().await {
                    tracing::error!(error = %e, "ledger retention sweep failed");
                }
            }
        })
    };
    let reloads = tokio::spawn(crate::policy::start_reloads(
        Arc::clone(&services.policies),
        schedule.reload,
    ));
    let (answering, store_health) = watch::channel(true);
    let probe = tokio::spawn(probe_store(
        Arc::clone(&services.store),
        answering,
        schedule.store_probe,
    ));
    Running {
        tasks: vec![expiry, retention, reloads, probe],
        store_health,
    }
}

/// Runs `job` every `period` (the first time at once), one run at a time.
fn every<F, Fut>(period: Duration, job: F) -> JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            job().await;
        }
    })
}

/// Asks the store every `period` whether it answers, and says so on
/// `answering` when that changes (logged once per change).
async fn probe_store(store: Arc<dyn Store>, answering: watch::Sender<bool>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let result = store.ping().await;
        if result.is_ok() == *answering.borrow() {
            continue;
        }
        match &result {
            Ok(()) => tracing::info!("the store answers again: SERVING"),
            Err(e) => tracing::error!(error = %e, "the store does not answer: NOT_SERVING"),
        }
        answering.send_replace(result.is_ok());
    }
}
