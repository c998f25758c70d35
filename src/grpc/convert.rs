//! Translations between wire and domain types, and the one place that turns
//! domain errors into gRPC statuses.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::pb;
use crate::clock::UnixMillis;
use crate::decision::Decision;
use crate::envelope::{Envelope, ExecutorError, RequestError, TenantNotGranted};
use crate::identity::Caller;
use crate::ledger::RecordedError;
use crate::tools::Risk;

/// An executor mistake: `INVALID_ARGUMENT` with a `BadRequest` field violation.
pub fn executor_status(e: &ExecutorError) -> Status {
    Status::with_error_details(
        Code::InvalidArgument,
        e.to_string(),
        ErrorDetails::with_bad_request_violation(e.field, e.description.clone()),
    )
}

/// A request refused as a request: an executor mistake, or a tenant the
/// caller may not act for.
pub fn request_status(e: &RequestError) -> Status {
    match e {
        RequestError::Invalid(e) => executor_status(e),
        RequestError::TenantNotGranted(e) => tenant_status(e),
    }
}

/// A request that runs as a tenant the caller's grants do not name:
/// `PERMISSION_DENIED`, with `ErrorInfo` reason `tenant_not_granted` and the
/// tenant.
pub fn tenant_status(e: &TenantNotGranted) -> Status {
    let details = ErrorDetails::with_error_info(
        "tenant_not_granted",
        "toolgate",
        [("tenant".to_owned(), e.tenant.clone())],
    );
    Status::with_error_details(Code::PermissionDenied, e.to_string(), details)
}

/// A request whose principal could not be established (`unauthorized`,
/// where no answer carries an envelope): `UNAUTHENTICATED`, with the
/// envelope's reason as `ErrorInfo`.
pub fn unauthenticated(e: &Envelope) -> Status {
    use tonic_types::{ErrorDetails, StatusExt as _};
    let reason = e
        .details
        .get("reason")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("unauthorized");
    let details = ErrorDetails::with_error_info(reason, "toolgate", []);
    Status::with_error_details(tonic::Code::Unauthenticated, e.message.clone(), details)
}

pub fn envelope(e: &Envelope) -> pb::ErrorEnvelope {
    recorded_error(&e.into())
}

pub fn recorded_error(e: &RecordedError) -> pb::ErrorEnvelope {
    pb::ErrorEnvelope {
        code: e.code.clone(),
        category: e.category.clone(),
        message: e.message.clone(),
        retryable: e.retryable,
        resolution: e.resolution.clone(),
        expose_to_model: e.expose_to_model,
        expose_to_user: e.expose_to_user,
        details_json: e.details_json.clone(),
    }
}

pub fn decision(d: Decision) -> pb::Decision {
    match d {
        Decision::Allow => pb::Decision::Allow,
        Decision::Deny => pb::Decision::Deny,
        Decision::ApprovalRequired => pb::Decision::ApprovalRequired,
    }
}

pub fn risk(r: Option<Risk>) -> pb::RiskLevel {
    match r {
        None => pb::RiskLevel::Unspecified,
        Some(Risk::Read) => pb::RiskLevel::Read,
        Some(Risk::Write) => pb::RiskLevel::Write,
        Some(Risk::External) => pb::RiskLevel::External,
        Some(Risk::Financial) => pb::RiskLevel::Financial,
        Some(Risk::Destructive) => pb::RiskLevel::Destructive,
    }
}

pub fn caller(auth: Option<pb::AuthContext>) -> Option<Caller> {
    let pb::AuthContext {
        subject_id,
        tenant_id,
        scopes,
        roles,
        agent_id,
        session_id,
        identity_token: _,
    } = auth?;
    Some(Caller {
        subject_id,
        tenant_id,
        scopes,
        roles,
        agent_id,
        session_id,
    })
}

pub fn timestamp(ms: UnixMillis) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

/// The earlier of the request's `deadline` field and the gRPC deadline
/// (`grpc-timeout`), as an instant on the monotonic clock.
///
/// Total over every value the wire types can carry: a deadline already past
/// (or before 1970, or with negative nanos) leaves no time at all; one too
/// far ahead for the clock to represent is no limit, as if absent.
pub fn deadline(
    field: Option<&prost_types::Timestamp>,
    metadata: &MetadataMap,
    arrived: Instant,
) -> Option<Instant> {
    let from_field = field.and_then(|ts| arrived.checked_add(time_left(ts, SystemTime::now())?));
    let from_grpc = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .and_then(|d| arrived.checked_add(d));
    match (from_field, from_grpc) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The time from `now` to `ts`: zero when it has passed, `None` when it
/// lies beyond what `SystemTime` can hold.
fn time_left(ts: &prost_types::Timestamp, now: SystemTime) -> Option<Duration> {
    let Ok(secs) = u64::try_from(ts.seconds) else {
        return Some(Duration::ZERO);
    };
    let nanos = u32::try_from(ts.nanos).unwrap_or(0).min(999_999_999);
    let at = UNIX_EPOCH.checked_add(Duration::new(secs, nanos))?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `grpc-timeout`: up to 8 digits and a unit (H, M, S, m, u, n).
fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let unit = v.chars().last()?;
    let digits = v.get(..v.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n.checked_mul(3600)?),
        'M' => Duration::from_secs(n.checked_mul(60)?),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse_grpc_timeout("123456789m"), None);
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("10x"), None);
    }

    fn with_timeout(v: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Ok(v) = v.parse() {
            m.insert("grpc-timeout", v);
        }
        m
    }

    #[test]
    fn deadlines_at_the_ends_of_the_wire_types() {
        let arrived = Instant::now();
        let ts = |seconds, nanos| prost_types::Timestamp { seconds, nanos };
        let none = MetadataMap::new();
        // Past, before 1970, negative nanos: no time at all.
        for t in [ts(0, 0), ts(-1, 0), ts(i64::MIN, i32::MIN), ts(1, -1)] {
            assert_eq!(deadline(Some(&t), &none, arrived), Some(arrived), "{t:?}");
        }
        // At the end of the range: no panic, and no limit worth the name
        // (none, where the monotonic clock cannot hold it).
        let far = deadline(Some(&ts(i64::MAX, i32::MAX)), &none, arrived);
        let millennia = Duration::from_secs(1_000 * 366 * 86_400);
        assert!(far.is_none_or(|at| at > arrived + millennia), "{far:?}");
        // The largest grpc-timeout bounds a far-future field.
        let hours = Duration::from_secs(99_999_999 * 3600);
        assert_eq!(
            deadline(Some(&ts(i64::MAX, 0)), &with_timeout("99999999H"), arrived),
            arrived.checked_add(hours)
        );
    }

    proptest::proptest! {
        /// Any Timestamp and any grpc-timeout text: an answer, never a
        /// panic, never before the call arrived, never after either bound.
        #[test]
        fn deadline_is_total(
            seconds in proptest::num::i64::ANY,
            nanos in proptest::num::i32::ANY,
            timeout in "[0-9]{0,9}[HMSmunx]?",
        ) {
            let arrived = Instant::now();
            let field = prost_types::Timestamp { seconds, nanos };
            let metadata = with_timeout(&timeout);
            let got = deadline(Some(&field), &metadata, arrived);
            let grpc = parse_grpc_timeout(&timeout).and_then(|d| arrived.checked_add(d));
            if let Some(at) = got {
                proptest::prop_assert!(at >= arrived);
                if let Some(g) = grpc {
                    proptest::prop_assert!(at <= g);
                }
            } else {
                proptest::prop_assert!(grpc.is_none());
            }
        }
    }
}
