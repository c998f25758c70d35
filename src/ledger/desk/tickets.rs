//! Execution tickets: the keys loaded from the store (again on an unknown
//! version), the ALLOW's ticket issued, a Begin's ticket checked.

use std::sync::Arc;

use super::{AllowedCall, LedgerDesk};
use crate::envelope::{Envelope, ErrorCode};
use crate::ledger::{LedgerConfig, TicketClaims, TicketKey, TicketKeys, TicketRefusal};
use crate::store::StoreError;

impl LedgerDesk {
    /// The ticket keys: those loaded, else the store's (made on the first
    /// start of the database), loaded now.
    ///
    /// # Errors
    /// [`StoreError`] when the store fails or there is no randomness.
    pub async fn ticket_keys(&self) -> Result<Arc<TicketKeys>, StoreError> {
        if let Some(keys) = self.ticket_keys.load_full() {
            return Ok(keys);
        }
        self.reload_ticket_keys().await
    }

    pub(super) async fn reload_ticket_keys(&self) -> Result<Arc<TicketKeys>, StoreError> {
        let candidate = TicketKey::generate(1).map_err(|_| StoreError::Random)?;
        let keys = self.store.ticket_keys(candidate).await?;
        let keys = Arc::new(
            TicketKeys::new(keys)
                .ok_or_else(|| StoreError::Corrupt("the store holds no ticket key".into()))?,
        );
        self.ticket_keys.store(Some(Arc::clone(&keys)));
        Ok(keys)
    }

    /// The execution ticket of an ALLOW decision for a call with an
    /// idempotency key (empty otherwise, and when the keys cannot be read:
    /// the Begin then refuses, fail closed).
    pub async fn ticket_for(&self, allowed: Option<&AllowedCall<'_>>) -> String {
        let Some(allowed) = allowed.filter(|a| !a.idempotency_key.is_empty()) else {
            return String::new();
        };
        let principal = allowed.principal;
        let claims = TicketClaims {
            tenant_id: &principal.tenant_id,
            subject_id: &principal.subject_id,
            idempotency_key: allowed.idempotency_key,
            arguments_sha256: allowed.arguments_sha256,
            tool: allowed.tool,
        };
        self.ticket(&claims).await.unwrap_or_else(|e| {
            self.store_failure(&e);
            String::new()
        })
    }

    /// A ticket for `claims`, valid for the configured `ticket_ttl` from now.
    ///
    /// # Errors
    /// [`StoreError`] when the keys cannot be read.
    pub async fn ticket(&self, claims: &TicketClaims<'_>) -> Result<String, StoreError> {
        let keys = self.ticket_keys().await?;
        let ttl = i64::try_from(self.config.ticket_ttl.as_millis()).unwrap_or(i64::MAX);
        Ok(keys.issue(claims, self.clock.now_ms().saturating_add(ttl)))
    }

    /// Checks a Begin's ticket; `Err` is the refusal to answer.
    pub(super) async fn check_ticket(
        &self,
        ticket: &str,
        claims: &TicketClaims<'_>,
    ) -> Result<(), Envelope> {
        let refusal = |r: TicketRefusal| {
            let message = match r {
                TicketRefusal::Missing => {
                    "BeginExecution needs the execution_ticket of the ALLOW decision of this call"
                }
                TicketRefusal::Expired => {
                    "the execution ticket expired: authorize the call again for a fresh one"
                }
                TicketRefusal::Invalid => {
                    "the execution ticket is not valid for this call (tenant, subject, key, hash and tool)"
                }
            };
            Envelope::new(ErrorCode::Unauthorized, message).with("reason", r.reason())
        };
        if ticket.is_empty() {
            return Err(refusal(TicketRefusal::Missing));
        }
        let unavailable = |e: &StoreError| self.store_failure(e);
        let mut keys = self.ticket_keys().await.map_err(|e| unavailable(&e))?;
        if keys.lacks_version_of(ticket) {
            // Rotated by another replica since this one loaded the keys.
            keys = self
                .reload_ticket_keys()
                .await
                .map_err(|e| unavailable(&e))?;
        }
        keys.verify(ticket, claims, self.clock.now_ms())
            .map_err(refusal)
    }

    /// The ledger's settings.
    #[must_use]
    pub const fn config(&self) -> &LedgerConfig {
        &self.config
    }
}
