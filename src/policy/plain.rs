//! Plain Cedar: a request evaluated against a schema, policies and entities
//! given as Cedar's own text and JSON, with none of toolgate's model around
//! it (no generated schema, no `@id` renaming, no tool contracts).
//!
//! This is the narrow entry point through which the Cedar project's
//! integration tests (`../shared/conformance/cedar-integration-tests`) run.
//! It parses and validates with Cedar, slices with [`PolicySlices`] and
//! decides with [`evaluate`], the very function toolgate's tool-call and
//! approval decisions call: the suite's expected decisions, reasons and
//! errors therefore hold for toolgate's evaluation, slicing included.
//! Nothing on the decision path uses this module.

use std::str::FromStr;

use cedar_policy::{
    Context, Entities, EntityUid, PolicySet, Request, Schema, ValidationMode, Validator,
};
use serde_json::Value;

use super::slice::{PolicySlices, evaluate};

/// Why a plain set or request could not be built. The message is Cedar's.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlainCedarError {
    #[error("invalid schema: {0}")]
    Schema(String),
    #[error("invalid policies: {0}")]
    Policies(String),
    #[error("invalid entities: {0}")]
    Entities(String),
    #[error("invalid request: {0}")]
    Request(String),
}

/// A schema, a policy set (Cedar's own positional ids `policy0`, `policy1`, …)
/// and entities, ready to answer requests.
#[derive(Debug)]
pub struct PlainCedar {
    schema: Schema,
    policies: PolicySlices,
    entities: Entities,
    validation_errors: Vec<String>,
}

/// Cedar's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainAnswer {
    pub allowed: bool,
    /// Determining policy ids, sorted.
    pub reasons: Vec<String>,
    /// Ids of policies that failed to evaluate, sorted.
    pub errors: Vec<String>,
}

impl PlainCedar {
    /// Parses the schema (Cedar schema syntax), the policies and the entities
    /// (Cedar entity JSON, checked against the schema), validates the
    /// policies in strict mode and slices them by action.
    ///
    /// # Errors
    /// [`PlainCedarError`] when a text does not parse or the entities do not
    /// conform. Validation errors are not an error: see
    /// [`Self::validation_errors`].
    pub fn new(schema: &str, policies: &str, entities: &Value) -> Result<Self, PlainCedarError> {
        let (schema, _warnings) = Schema::from_cedarschema_str(schema)
            .map_err(|e| PlainCedarError::Schema(e.to_string()))?;
        let set =
            PolicySet::from_str(policies).map_err(|e| PlainCedarError::Policies(e.to_string()))?;
        let validation_errors = Validator::new(schema.clone())
            .validate(&set, ValidationMode::Strict)
            .validation_errors()
            .map(ToString::to_string)
            .collect();
        let entities = Entities::from_json_value(entities.clone(), Some(&schema))
            .map_err(|e| PlainCedarError::Entities(e.to_string()))?;
        let actions = schema
            .action_entities()
            .map_err(|e| PlainCedarError::Schema(e.to_string()))?;
        let policies = PolicySlices::build(set, &actions)
            .map_err(|e| PlainCedarError::Policies(e.to_string()))?;
        Ok(Self {
            schema,
            policies,
            entities,
            validation_errors,
        })
    }

    /// The strict-mode validation errors of the policies (empty when they validate).
    #[must_use]
    pub fn validation_errors(&self) -> &[String] {
        &self.validation_errors
    }

    /// Evaluates one request. `principal`, `action` and `resource` are Cedar
    /// entity references (`{"type": …, "id": …}`); `context` is a Cedar JSON
    /// record. With `validate`, the request and context are checked against
    /// the schema first, as toolgate always does.
    ///
    /// # Errors
    /// [`PlainCedarError::Request`] when the request is malformed or, with
    /// `validate`, does not conform to the schema.
    pub fn evaluate(
        &self,
        principal: &Value,
        action: &Value,
        resource: &Value,
        context: &Value,
        validate: bool,
    ) -> Result<PlainAnswer, PlainCedarError> {
        let uid = |v: &Value| {
            EntityUid::from_json(v.clone()).map_err(|e| PlainCedarError::Request(e.to_string()))
        };
        let action = uid(action)?;
        let schema = validate.then_some(&self.schema);
        let context = Context::from_json_value(context.clone(), schema.map(|s| (s, &action)))
            .map_err(|e| PlainCedarError::Request(e.to_string()))?;
        let request = Request::new(
            uid(principal)?,
            action.clone(),
            uid(resource)?,
            context,
            schema,
        )
        .map_err(|e| PlainCedarError::Request(e.to_string()))?;
        let answer = evaluate(&self.policies, &action, &request, &self.entities);
        Ok(PlainAnswer {
            allowed: answer.allowed,
            reasons: answer.reasons,
            errors: answer.errors,
        })
    }
}
