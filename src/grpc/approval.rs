//! `ApprovalService`: list, read, decide and watch approvals, for approval UIs.

use std::sync::Arc;

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::{convert, pb};
use crate::approvals::desk::{ApprovalDesk, ApprovalWatch, DeskError};
use crate::approvals::{ApprovalEventKind, ApprovalRecord, ApprovalStatus, WatchEnd};
use crate::envelope::ErrorCode;

/// The approval API for approval UIs.
#[derive(Debug, Clone)]
pub struct ApprovalApi {
    desk: Arc<ApprovalDesk>,
    /// Becomes `true` when the server starts shutting down.
    stopping: watch::Receiver<bool>,
}

impl ApprovalApi {
    pub fn new(desk: Arc<ApprovalDesk>, stopping: watch::Receiver<bool>) -> Self {
        Self { desk, stopping }
    }
}

/// How long a watcher's full queue may delay the shutdown notice.
const SHUTDOWN_NOTICE_WAIT: Duration = Duration::from_secs(1);

/// A desk error on an RPC that has no envelope field: a status whose
/// `ErrorInfo` reason is the envelope code.
fn status(e: &DeskError) -> Status {
    let code = match e.0.code {
        ErrorCode::Unauthorized => Code::Unauthenticated,
        ErrorCode::ApprovalNotFound => Code::NotFound,
        ErrorCode::InvalidArguments => Code::InvalidArgument,
        // `view_approval` refuses (a deny, or a policy that fails: fail closed).
        ErrorCode::Forbidden | ErrorCode::PolicyError => Code::PermissionDenied,
        // A watch over the caller's cap.
        ErrorCode::RateLimited => Code::ResourceExhausted,
        _ => Code::Unavailable,
    };
    let details = ErrorDetails::with_error_info(
        e.0.code.as_str(),
        "toolgate",
        e.0.details
            .iter()
            .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
            .collect::<std::collections::HashMap<_, _>>(),
    );
    Status::with_error_details(code, e.0.message.clone(), details)
}

pub fn approval(r: &ApprovalRecord) -> pb::Approval {
    let status = match r.status {
        ApprovalStatus::Pending => pb::ApprovalStatus::Pending,
        ApprovalStatus::Approved => pb::ApprovalStatus::Approved,
        ApprovalStatus::Rejected => pb::ApprovalStatus::Rejected,
        ApprovalStatus::Expired => pb::ApprovalStatus::Expired,
    };
    pb::Approval {
        approval_id: r.approval_id.clone(),
        tenant_id: r.tenant_id.clone(),
        requester_subject_id: r.requester_subject_id.clone(),
        agent_id: r.agent_id.clone(),
        tool: r.tool.clone(),
        tool_version: r.tool_version.clone(),
        risk: convert::risk(Some(r.risk)).into(),
        arguments_sha256: r.arguments_sha256.clone(),
        display_arguments: r.display_arguments.clone(),
        request_id: r.request_id.clone(),
        status: status.into(),
        created_at: Some(convert::timestamp(r.created_at)),
        expires_at: Some(convert::timestamp(r.expires_at)),
        decided_by: r.decided_by.clone().unwrap_or_default(),
        decided_at: r.decided_at.map(convert::timestamp),
        reason: r.reason.clone().unwrap_or_default(),
        consumed_by_idempotency_key: r.consumed_by_idempotency_key.clone().unwrap_or_default(),
        why: Some(pb::ApprovalWhy {
            reason: r.why.reason.clone().unwrap_or_default(),
            budgets: r
                .why
                .budgets
                .iter()
                .map(|b| pb::ApprovalBudget {
                    name: b.name.clone(),
                    used: b.used,
                    this_call: b.this_call,
                    limit: b.limit,
                    decimals: u32::from(b.decimals),
                    window_seconds: b.window_seconds,
                })
                .collect(),
        }),
    }
}

fn status_filter(s: pb::ApprovalStatus) -> Option<ApprovalStatus> {
    match s {
        pb::ApprovalStatus::Unspecified => None,
        pb::ApprovalStatus::Pending => Some(ApprovalStatus::Pending),
        pb::ApprovalStatus::Approved => Some(ApprovalStatus::Approved),
        pb::ApprovalStatus::Rejected => Some(ApprovalStatus::Rejected),
        pb::ApprovalStatus::Expired => Some(ApprovalStatus::Expired),
    }
}

#[tonic::async_trait]
impl pb::approval_service_server::ApprovalService for ApprovalApi {
    type WatchApprovalsStream = ReceiverStream<Result<pb::WatchApprovalsResponse, Status>>;

    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let pb::ListApprovalsRequest {
            identity_token,
            status: filter,
            page_size,
            page_token,
        } = request.into_inner();
        let filter = status_filter(
            pb::ApprovalStatus::try_from(filter).unwrap_or(pb::ApprovalStatus::Unspecified),
        );
        let page = self
            .desk
            .list(
                &identity_token,
                filter,
                usize::try_from(page_size).unwrap_or(usize::MAX),
                &page_token,
            )
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::ListApprovalsResponse {
            approvals: page.approvals.iter().map(approval).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn get_approval(
        &self,
        request: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::GetApprovalResponse>, Status> {
        let pb::GetApprovalRequest {
            identity_token,
            approval_id,
        } = request.into_inner();
        let r = self
            .desk
            .get(&identity_token, &approval_id)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::GetApprovalResponse {
            approval: Some(approval(&r)),
        }))
    }

    async fn decide_approval(
        &self,
        request: Request<pb::DecideApprovalRequest>,
    ) -> Result<Response<pb::DecideApprovalResponse>, Status> {
        let peer = super::admitted::peer(&request);
        let pb::DecideApprovalRequest {
            identity_token,
            approval_id,
            verdict,
            arguments_sha256,
            reason,
        } = request.into_inner();
        let approve = match pb::Verdict::try_from(verdict) {
            Ok(pb::Verdict::Approve) => true,
            Ok(pb::Verdict::Reject) => false,
            _ => {
                return Err(Status::with_error_details(
                    Code::InvalidArgument,
                    "invalid `verdict`: must be VERDICT_APPROVE or VERDICT_REJECT",
                    ErrorDetails::with_bad_request_violation(
                        "verdict",
                        "must be VERDICT_APPROVE or VERDICT_REJECT",
                    ),
                ));
            }
        };
        match self
            .desk
            .decide(
                &identity_token,
                &approval_id,
                approve,
                &arguments_sha256,
                &reason,
                &peer,
            )
            .await
        {
            Ok(r) => Ok(Response::new(pb::DecideApprovalResponse {
                approval: Some(approval(&r)),
                error: None,
            })),
            Err(DeskError(e)) => Ok(Response::new(pb::DecideApprovalResponse {
                approval: None,
                error: Some(convert::envelope(&e)),
            })),
        }
    }

    async fn watch_approvals(
        &self,
        request: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        let pb::WatchApprovalsRequest { identity_token } = request.into_inner();
        let mut watch = self
            .desk
            .watch(&identity_token)
            .await
            .map_err(|e| status(&e))?;
        let (tx, rx) = mpsc::channel(64);
        let mut stopping = self.stopping.clone();
        tokio::spawn(async move {
            tokio::select! {
                end = forward(&mut watch, &tx) => {
                    if let Some(notice) = end_notice(end) {
                        let _ = tokio::time::timeout(SHUTDOWN_NOTICE_WAIT, tx.send(Err(notice))).await;
                    }
                }
                // The client went away: the task never outlives its stream,
                // even when no event comes to find the stream closed.
                () = tx.closed() => {}
                () = async { let _ = stopping.wait_for(|s| *s).await; } => {
                    let notice = Status::unavailable("the server is shutting down; watch again");
                    let _ = tokio::time::timeout(SHUTDOWN_NOTICE_WAIT, tx.send(Err(notice))).await;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Streams the events the desk's watch yields (the caller's tenant's, that
/// it may view) until the watch ends, which is returned; `None` when the
/// client went away.
async fn forward(
    watch: &mut ApprovalWatch,
    tx: &mpsc::Sender<Result<pb::WatchApprovalsResponse, Status>>,
) -> Option<WatchEnd> {
    loop {
        let event = match watch.next().await {
            Ok(event) => event,
            Err(end) => return Some(end),
        };
        let kind = match event.kind {
            ApprovalEventKind::Created => pb::ApprovalEventKind::Created,
            ApprovalEventKind::Decided => pb::ApprovalEventKind::Decided,
            ApprovalEventKind::Expired => pb::ApprovalEventKind::Expired,
            ApprovalEventKind::Consumed => pb::ApprovalEventKind::Consumed,
        };
        let msg = pb::WatchApprovalsResponse {
            event: Some(pb::ApprovalEvent {
                kind: kind.into(),
                approval: Some(approval(&event.approval)),
            }),
        };
        if tx.send(Ok(msg)).await.is_err() {
            return None;
        }
    }
}

/// The status that ends a watch: never a silent end, so the UI re-lists.
fn end_notice(end: Option<WatchEnd>) -> Option<Status> {
    Some(match end? {
        // A watch is no longer than its token: the UI watches again with a
        // fresh one.
        WatchEnd::TokenExpired => {
            Status::unauthenticated("the identity token expired; watch again with a fresh token")
        }
        // A watcher that fell behind must re-list: never a silent gap.
        WatchEnd::Lagged(n) => Status::data_loss(format!(
            "the watch fell {n} events behind; list again and watch anew"
        )),
        // Other replicas' events may have been missed.
        WatchEnd::Gap => Status::data_loss(
            "approval events from other replicas may have been missed; list again and watch anew",
        ),
        WatchEnd::Closed => return None,
    })
}
