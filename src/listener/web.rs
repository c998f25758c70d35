//! gRPC-Web for the gRPC services, around the plain HTTP doors (AuthZEN,
//! the approval console): tonic-web answers every HTTP/1.1 request that is
//! not gRPC-Web with `400`, so the doors' plain HTTP/1.1 requests go
//! straight to the routes (behind the admission layer all the same).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::body::Body;
use tower::ServiceExt as _;

use crate::access::{Target, target_of_path};

/// The layer: gRPC-Web translation for every path but the plain HTTP doors'.
#[derive(Debug, Clone, Default)]
pub struct GrpcWebExceptDoorLayer;

impl<S: Clone> tower::Layer<S> for GrpcWebExceptDoorLayer {
    type Service = GrpcWebExceptDoor<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcWebExceptDoor {
            web: tower::Layer::layer(&tonic_web::GrpcWebLayer::new(), inner.clone()),
            plain: inner,
        }
    }
}

/// The service the layer makes.
#[derive(Debug, Clone)]
pub struct GrpcWebExceptDoor<S> {
    web: tonic_web::GrpcWebService<S>,
    plain: S,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S> tower::Service<http::Request<Body>> for GrpcWebExceptDoor<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each call waits for its own clone to be ready (`oneshot`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if matches!(target_of_path(req.uri().path()), Target::Service(s) if s.is_plain_http()) {
            Box::pin(self.plain.clone().oneshot(req))
        } else {
            Box::pin(self.web.clone().oneshot(req))
        }
    }
}
