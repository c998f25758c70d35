//! The cross-replica event bridge: other replicas' approval changes, read
//! back from the database and published into this process's hub; this
//! replica's announced in the change's own transaction.

use tokio_postgres::{AsyncMessage, NoTls};

use super::super::{APPROVAL_COLUMNS, StoreError};
use super::{CHANNEL, PostgresStore, approval_from_row, kind_from_name, kind_name};
use crate::approvals::{ApprovalEventKind, ApprovalEvents, ApprovalRecord};

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
    /// until the connection ends.
    pub(super) async fn listen(
        &self,
    ) -> Result<
        (
            tokio_postgres::Client,
            tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
        ),
        StoreError,
    > {
        let (client, mut connection) = self.config.connect(NoTls).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        if tx.send(n).is_err() {
                            return;
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
        });
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
