//! The cross-replica event bridge: other replicas' approval changes, read
//! back from the database and published into this process's hub; this
//! replica's announced in the change's own transaction.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{AsyncMessage, NoTls};

use super::super::{APPROVAL_COLUMNS, StoreError};
use super::tls::Tls;
use super::{CHANNEL, PostgresStore, approval_from_row, kind_from_name, kind_name};
use crate::approvals::{ApprovalEventKind, ApprovalEvents, ApprovalRecord};

/// What the listening connection hands the relay.
#[derive(Debug)]
pub(super) enum Relayed {
    Event(tokio_postgres::Notification),
    /// At least one notification was dropped: the queue was full.
    Lost,
}

/// A listening connection (kept open while held) and its notifications.
pub(super) type Listening = (tokio_postgres::Client, tokio::sync::mpsc::Receiver<Relayed>);

/// The most notifications waiting to be relayed; past it they are dropped
/// and announced as a gap.
pub(super) const RELAY_QUEUE: usize = 1024;

/// The longest wait before reconnecting the event relay.
const MAX_RELAY_BACKOFF: Duration = Duration::from_secs(5);

impl PostgresStore {
    /// The approval with this id, whatever its tenant: for the relay, which
    /// publishes it to the watchers of its own tenant only.
    pub(super) async fn approval_by_id(
        &self,
        approval_id: &str,
    ) -> Result<Option<ApprovalRecord>, StoreError> {
        self.run(|client| async move {
            let sql = format!("SELECT {APPROVAL_COLUMNS} FROM approvals WHERE approval_id = $1");
            let stmt = client.prepare_cached(&sql).await?;
            let row = client.query_opt(&stmt, &[&approval_id]).await?;
            Ok(row.as_ref().map(approval_from_row).transpose()?)
        })
        .await
    }

    /// The payload that announces `kind` of an approval, as SQL: this
    /// store's origin is the statement's parameter `$origin`.
    pub(super) fn announce(kind: ApprovalEventKind, origin_param: &str) -> String {
        format!(
            "pg_notify('{CHANNEL}', '{} ' || {origin_param}::text || ' ' || approval_id)::text",
            kind_name(kind)
        )
    }

    /// Listens on a connection of its own; returns the client (which must
    /// be kept: dropping it closes the connection) and the notifications
    /// until the connection ends, at most `queue` of them waiting: past
    /// that, one is dropped and [`Relayed::Lost`] takes its place (watchers
    /// re-list), so another replica's burst never grows this one's memory.
    pub(super) async fn listen(&self, queue: usize) -> Result<Listening, StoreError> {
        let (tx, rx) = tokio::sync::mpsc::channel(queue.max(2));
        let client = match &self.tls {
            Tls::Off => {
                let (client, connection) = self.config.connect(NoTls).await?;
                tokio::spawn(forward(connection, tx));
                client
            }
            Tls::Rustls(tls) => {
                let (client, connection) = self.config.connect(tls.clone()).await?;
                tokio::spawn(forward(connection, tx));
                client
            }
        };
        let listen = format!("LISTEN {CHANNEL}");
        tokio::time::timeout(
            self.settings.statement_timeout,
            client.batch_execute(&listen),
        )
        .await
        .map_err(|_| StoreError::Timeout {
            ms: self.settings.statement_timeout.as_millis(),
        })??;
        Ok((client, rx))
    }

    /// The relay's loop: listens, publishes, and listens again after a lost
    /// connection (announcing the gap), with at most `queue` notifications
    /// waiting at any time.
    pub(super) fn relay(
        &self,
        events: Arc<ApprovalEvents>,
        first: Listening,
        queue: usize,
    ) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        tokio::spawn(async move {
            let mut listening = Some(first);
            let mut failures: u32 = 0;
            loop {
                if let Some((client, mut notifications)) = listening.take() {
                    failures = 0;
                    while let Some(relayed) = notifications.recv().await {
                        match relayed {
                            Relayed::Event(n) => store.relay_one(&events, n.payload()).await,
                            Relayed::Lost => {
                                tracing::warn!(
                                    "approval events came faster than they could be relayed; watchers must re-list"
                                );
                                events.announce_gap();
                            }
                        }
                    }
                    drop(client);
                    // Whatever was sent from now until we listen again is lost.
                    events.announce_gap();
                }
                failures = failures.saturating_add(1);
                let wait = Duration::from_millis(100u64 << failures.min(6)).min(MAX_RELAY_BACKOFF);
                tokio::time::sleep(wait).await;
                match store.listen(queue).await {
                    Ok(again) => {
                        tracing::info!("the approval event relay listens again");
                        // Watchers that came while it was down missed events too.
                        events.announce_gap();
                        listening = Some(again);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the approval event relay cannot listen yet");
                    }
                }
            }
        })
    }

    /// Publishes one other replica's event, read back from the database.
    pub(super) async fn relay_one(&self, events: &ApprovalEvents, payload: &str) {
        let mut parts = payload.splitn(3, ' ');
        let (Some(kind), Some(origin), Some(approval_id)) = (
            parts.next().and_then(kind_from_name),
            parts.next(),
            parts.next(),
        ) else {
            tracing::warn!("an approval event notification is malformed; ignored");
            return;
        };
        if origin == &*self.origin {
            return;
        }
        match self.approval_by_id(approval_id).await {
            Ok(Some(record)) => events.relay(kind, &record),
            // Deleted since: nothing to show.
            Ok(None) => {}
            Err(e) => {
                tracing::error!(error = %e, "cannot read a relayed approval event; watchers must re-list");
                events.announce_gap();
            }
        }
    }
}

/// Hands the notifications of `connection` to the relay until the
/// connection ends (dropping `tx` says so), whatever its transport; with
/// the queue full one is dropped and [`Relayed::Lost`] sent when there is
/// room again.
async fn forward<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    tx: tokio::sync::mpsc::Sender<Relayed>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::sync::mpsc::error::TrySendError;
    // A notification dropped while the queue was full, not yet told.
    let mut lost = false;
    loop {
        let message = if lost {
            // A loss at the end of a burst is told as soon as there is
            // room, not only when another notification comes.
            tokio::select! {
                permit = tx.reserve() => {
                    match permit {
                        Ok(permit) => {
                            permit.send(Relayed::Lost);
                            lost = false;
                            continue;
                        }
                        Err(_) => return,
                    }
                }
                message = std::future::poll_fn(|cx| connection.poll_message(cx)) => message,
            }
        } else {
            std::future::poll_fn(|cx| connection.poll_message(cx)).await
        };
        match message {
            Some(Ok(AsyncMessage::Notification(n))) => {
                if lost {
                    match tx.try_send(Relayed::Lost) {
                        Ok(()) => lost = false,
                        Err(TrySendError::Full(_)) => continue,
                        Err(TrySendError::Closed(_)) => return,
                    }
                }
                match tx.try_send(Relayed::Event(n)) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => lost = true,
                    Err(TrySendError::Closed(_)) => return,
                }
            }
            Some(Ok(_)) => {}
            // Terminal: the connection is gone; dropping `tx` says so.
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the approval event relay lost its connection");
                return;
            }
            None => return,
        }
    }
}
