//! Who an executor's request runs as (DESIGN §1): the one rule, shared by
//! decisions and the ledger.

use std::sync::Arc;

use super::{Caller, IdentityVerifier};
use crate::access::TenantScope;
use crate::clock::UnixMillis;
use crate::envelope::{Checked, Envelope, ErrorCode, ExecutorError, RequestError};

/// The authenticated caller of an executor's request: an auth context with
/// a subject and a tenant, or the executor's mistake.
///
/// # Errors
/// [`ExecutorError`] on `auth`, `auth.subject_id` or `auth.tenant_id`.
pub fn require_caller(caller: Option<&Caller>) -> Result<&Caller, ExecutorError> {
    let caller =
        caller.ok_or_else(|| ExecutorError::new("auth", "the auth context is required"))?;
    if caller.subject_id.is_empty() {
        return Err(ExecutorError::new("auth.subject_id", "must not be empty"));
    }
    if caller.tenant_id.is_empty() {
        return Err(ExecutorError::new("auth.tenant_id", "must not be empty"));
    }
    Ok(caller)
}

/// How the principal of an executor's request is established (DESIGN §1):
/// the auth context as sent, or — when the deployment requires identity
/// tokens — the verified token's claims, which the auth context's own
/// fields must agree with; `agent_id` and `session_id` always come from the
/// auth context. The one home of this rule, for decisions and the ledger.
#[derive(Debug, Clone, Default)]
pub struct Principals {
    verifier: Option<Arc<dyn IdentityVerifier>>,
    required: bool,
}

impl Principals {
    /// Identity tokens are verified with `verifier`; when `required`, the
    /// principal comes from them.
    #[must_use]
    pub fn new(verifier: Option<Arc<dyn IdentityVerifier>>, required: bool) -> Self {
        Self { verifier, required }
    }

    /// [`Self::resolve`], then the one tenant check of decisions and the
    /// ledger: a principal of a tenant outside `tenants` is refused.
    ///
    /// # Errors
    /// As [`Self::resolve`], and [`RequestError::TenantNotGranted`].
    pub fn resolve_within(
        &self,
        auth: Option<&Caller>,
        identity_token: &str,
        now: UnixMillis,
        tenants: &TenantScope,
    ) -> Result<Checked<Caller>, RequestError> {
        let principal = self.resolve(auth, identity_token, now)?;
        if let Some(caller) = principal.passed() {
            tenants.admit(&caller.tenant_id)?;
        }
        Ok(principal)
    }

    /// The principal of a request whose auth context is `auth`, carrying
    /// `identity_token`, at `now`. [`Checked::Refused`] is an `unauthorized`
    /// envelope whose `details.reason` says why (`missing_token`,
    /// `subject_mismatch`, the token's own failure such as `expired`, …).
    ///
    /// # Errors
    /// [`ExecutorError`] when there is no auth context or, without required
    /// tokens, it names no subject or tenant.
    pub fn resolve(
        &self,
        auth: Option<&Caller>,
        identity_token: &str,
        now: UnixMillis,
    ) -> Result<Checked<Caller>, ExecutorError> {
        if !self.required {
            return Ok(Checked::Passed(require_caller(auth)?.clone()));
        }
        let auth =
            auth.ok_or_else(|| ExecutorError::new("auth", "the auth context is required"))?;
        let refuse = |reason: &'static str| {
            Envelope::new(
                ErrorCode::Unauthorized,
                "the caller's identity token is missing, invalid, or disagrees with the auth context",
            )
            .with("reason", reason)
        };
        if identity_token.is_empty() {
            return Ok(Checked::Refused(refuse("missing_token")));
        }
        let Some(verifier) = &self.verifier else {
            return Ok(Checked::Refused(refuse("no_key_set")));
        };
        let verified = match verifier.verify(identity_token, now.div_euclid(1000)) {
            Ok(c) => c,
            Err(reason) => return Ok(Checked::Refused(refuse(reason))),
        };
        let disagrees = |given: &str, proven: &str| !given.is_empty() && given != proven;
        fn set(v: &[String]) -> std::collections::BTreeSet<&str> {
            v.iter().map(String::as_str).collect()
        }
        if disagrees(&auth.subject_id, &verified.subject_id) {
            return Ok(Checked::Refused(refuse("subject_mismatch")));
        }
        if disagrees(&auth.tenant_id, &verified.tenant_id) {
            return Ok(Checked::Refused(refuse("tenant_mismatch")));
        }
        if !auth.roles.is_empty() && set(&auth.roles) != set(&verified.roles) {
            return Ok(Checked::Refused(refuse("roles_mismatch")));
        }
        if !auth.scopes.is_empty() && set(&auth.scopes) != set(&verified.scopes) {
            return Ok(Checked::Refused(refuse("scopes_mismatch")));
        }
        Ok(Checked::Passed(Caller {
            agent_id: auth.agent_id.clone(),
            session_id: auth.session_id.clone(),
            ..verified
        }))
    }
}
