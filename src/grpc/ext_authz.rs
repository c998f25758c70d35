//! `envoy.service.auth.v3.Authorization/Check` (DESIGN §11.2): Envoy's
//! `CheckRequest` ⇄ the ext_authz door's domain types. The types and the
//! server trait are the `envoy-types` crate's (Envoy's own v3 protos); the
//! descriptor set reflection serves is compiled from the same protos
//! (`proto/envoy`, `build.rs`).

use std::sync::Arc;

use envoy_types::ext_authz::v3::pb::{
    Authorization, CheckRequest, CheckResponse, DeniedHttpResponse, HeaderAppendAction,
    HeaderValue, HeaderValueOption, HttpResponse, HttpStatus, OkHttpResponse,
};
use envoy_types::pb::envoy::service::auth::v3::attribute_context;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use tonic::{Request, Response, Status};

use crate::ext_authz::desk::{Check, ExtAuthzDesk};
use crate::ext_authz::{Answer, HttpRequest, PARTIAL_BODY_HEADER};

/// The encoded descriptor set of Envoy's `external_auth.proto` and every
/// file it imports, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/envoy_descriptor.bin"));

pub use envoy_types::ext_authz::v3::pb::AuthorizationServer;

/// The ext_authz service for proxies.
#[derive(Debug, Clone)]
pub struct ExtAuthzApi {
    desk: Arc<ExtAuthzDesk>,
}

impl ExtAuthzApi {
    pub fn new(desk: Arc<ExtAuthzDesk>) -> Self {
        Self { desk }
    }
}

#[tonic::async_trait]
impl Authorization for ExtAuthzApi {
    async fn check(
        &self,
        request: Request<CheckRequest>,
    ) -> Result<Response<CheckResponse>, Status> {
        let peer = super::admitted::peer(&request);
        let tenants = super::admitted::tenants(&request);
        let check = Check {
            request: http_request(request.into_inner()),
            peer,
            tenants,
        };
        let answer = self.desk.check(&check).await;
        Ok(Response::new(check_response(answer)))
    }
}

/// The HTTP request a `CheckRequest` describes. Header names are lower
/// case (Envoy sends them so; any other case is folded); the body is
/// `raw_body` (`pack_as_bytes`), else `body`.
fn http_request(req: CheckRequest) -> HttpRequest {
    let Some(http) = req.attributes.and_then(|a| a.request).and_then(|r| r.http) else {
        // No HTTP request at all: a POST without a body, refused.
        return HttpRequest {
            method: "POST".to_owned(),
            ..HttpRequest::default()
        };
    };
    let attribute_context::HttpRequest {
        method,
        headers,
        header_map,
        path,
        size,
        body,
        raw_body,
        ..
    } = http;
    let mut all: Vec<(String, String)> = headers
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    // `encode_raw_headers: true` sends them here instead.
    if let Some(map) = header_map {
        all.extend(map.headers.into_iter().map(|h| {
            let value = if h.raw_value.is_empty() {
                h.value
            } else {
                String::from_utf8_lossy(&h.raw_value).into_owned()
            };
            (h.key.to_ascii_lowercase(), value)
        }));
    }
    all.sort();
    let body = if raw_body.is_empty() {
        body.into_bytes()
    } else {
        raw_body
    };
    let cut_by_envoy = all
        .iter()
        .any(|(k, v)| k == PARTIAL_BODY_HEADER && v.eq_ignore_ascii_case("true"));
    let shorter_than_declared = u64::try_from(size)
        .is_ok_and(|declared| declared > u64::try_from(body.len()).unwrap_or(u64::MAX));
    HttpRequest {
        method,
        path,
        headers: all,
        body,
        partial: cut_by_envoy || shorter_than_declared,
    }
}

fn header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            value: value.to_owned(),
            ..HeaderValue::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

/// The `CheckResponse` of an answer: `OK` with an `OkHttpResponse`, or a
/// `DeniedHttpResponse` (`UNAUTHENTICATED` for a `401`, else
/// `PERMISSION_DENIED`) that Envoy sends the client as given.
fn check_response(answer: Answer) -> CheckResponse {
    match answer {
        Answer::Allow { set, remove } => CheckResponse {
            status: Some(RpcStatus {
                code: tonic::Code::Ok as i32,
                ..RpcStatus::default()
            }),
            http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                headers: set.iter().map(|(k, v)| header(k, v)).collect(),
                headers_to_remove: remove,
                ..OkHttpResponse::default()
            })),
            ..CheckResponse::default()
        },
        Answer::Respond(response) => {
            let code = if response.status == 401 {
                tonic::Code::Unauthenticated
            } else {
                tonic::Code::PermissionDenied
            };
            CheckResponse {
                status: Some(RpcStatus {
                    code: code as i32,
                    ..RpcStatus::default()
                }),
                http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                    status: Some(HttpStatus {
                        code: i32::from(response.status),
                    }),
                    headers: response.headers.iter().map(|(k, v)| header(k, v)).collect(),
                    body: response.body,
                })),
                ..CheckResponse::default()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::auth::v3::AttributeContext;
    use prost::Message as _;

    /// The descriptor set names the service and carries every file it
    /// depends on (so a generic client resolves all of it).
    #[test]
    fn the_descriptor_set_holds_the_service_and_all_its_imports() {
        let set = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap();
        let names: std::collections::BTreeSet<&str> =
            set.file.iter().filter_map(|f| f.name.as_deref()).collect();
        for f in &set.file {
            for dep in &f.dependency {
                assert!(names.contains(dep.as_str()), "{dep} is missing");
            }
        }
        let auth = set
            .file
            .iter()
            .find(|f| f.name.as_deref() == Some("envoy/service/auth/v3/external_auth.proto"))
            .unwrap();
        assert_eq!(auth.service[0].name.as_deref(), Some("Authorization"));
        assert_eq!(
            auth.service[0].method[0].input_type.as_deref(),
            Some(".envoy.service.auth.v3.CheckRequest")
        );
    }

    #[test]
    fn a_check_request_reads_as_the_http_request_it_describes() {
        let http = attribute_context::HttpRequest {
            method: "POST".into(),
            path: "/mcp".into(),
            headers: [
                ("content-type".to_owned(), "application/json".to_owned()),
                ("Toolgate-Decision-Id".to_owned(), "forged".to_owned()),
            ]
            .into(),
            size: 2,
            raw_body: b"{}".to_vec(),
            ..Default::default()
        };
        let req = CheckRequest {
            attributes: Some(AttributeContext {
                request: Some(attribute_context::Request {
                    http: Some(http.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        let read = http_request(req.clone());
        assert_eq!(read.method, "POST");
        assert_eq!(read.body, b"{}");
        assert!(!read.partial);
        assert_eq!(read.header("toolgate-decision-id"), Some("forged"));
        // Fewer bytes than declared: cut.
        let mut cut = req;
        cut.attributes
            .as_mut()
            .unwrap()
            .request
            .as_mut()
            .unwrap()
            .http = Some(attribute_context::HttpRequest { size: 10, ..http });
        assert!(http_request(cut).partial);
    }
}
