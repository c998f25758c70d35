//! The call stage: the model's bytes strictly decoded, the tool looked up
//! (and its version), the request id a side effect needs, the tool's rate
//! limit, the JSON Schema, the canonical form and hashes, the time budget.
//! What it learns goes into the outcome as it learns it.

use super::refusal::{Stop, deadline_exhausted, not_an_object, version_mismatch};
use super::{Hashed, ToolCallAuthorizer, decode_envelope, hash, request_id_required};
use crate::decision::outcome::{AuthorizeInput, AuthorizeOutcome};
use crate::decode;
use crate::envelope::{ErrorCode, unknown_tool};
use crate::identity::Caller;
use crate::policy::PolicyEngine;
use crate::tools::{Risk, ToolContract};

impl ToolCallAuthorizer {
    pub(super) fn the_call<'e>(
        &self,
        input: &AuthorizeInput,
        engine: &'e PolicyEngine,
        caller: &Caller,
        out: &mut AuthorizeOutcome,
    ) -> Result<Hashed<'e>, Stop> {
        if let Err(limited) = self.limits.check_tenant(&caller.tenant_id) {
            return Err(self.rate_limited(limited).into());
        }
        let args = decode::parse_strict(&input.arguments, &self.config.limits)
            .map_err(|e| decode_envelope(&e))?;
        if !args.is_object() {
            return Err(not_an_object().into());
        }

        let Some(tool) = engine.tools().get(&input.tool) else {
            return Err(unknown_tool(&input.tool).into());
        };
        let tool: &ToolContract = tool;
        out.risk = Some(tool.risk);
        out.parallel = tool.parallel;
        out.idempotent = tool.idempotent;
        out.tool_version.clone_from(&tool.version);
        if !input.tool_version.is_empty() && input.tool_version != tool.version {
            return Err(version_mismatch(tool, &input.tool_version).into());
        }
        if tool.risk != Risk::Read && input.request_id.is_empty() {
            return Err(request_id_required(tool).into());
        }
        if let Err(limited) = self.limits.check_tool(&caller.tenant_id, &tool.name) {
            return Err(self.rate_limited(limited).into());
        }

        let violations = tool.validate_input(&args, self.config.violation_cap);
        if let Some(envelope) = crate::envelope::violations(ErrorCode::SchemaViolation, &violations)
        {
            return Err(envelope.into());
        }

        let hashed = hash(tool, args, caller, &input.request_id)?;
        out.normalized_arguments.clone_from(&hashed.normalized);
        out.arguments_sha256.clone_from(&hashed.sha);
        out.idempotency_key.clone_from(&hashed.key);
        out.conflict_key.clone_from(&hashed.conflict_key);

        // The time budget, on the monotonic clock.
        out.timeout_ms = self
            .budget(tool, input.deadline)
            .ok_or_else(deadline_exhausted)?;
        Ok(hashed)
    }
}
