//! What the admission layer ([`crate::listener`]) left on an admitted
//! request, read by the handlers: the caller's transport identity, for the
//! audit log, and the tenants its grants of the service name.

use crate::access::{PeerIdentity, ReconcileScope, TenantScope};

/// The tenants the caller of a request may act for, as the access layer
/// found them. None at all when the layer set none (a wiring mistake):
/// fail closed.
pub(super) fn tenants<T>(request: &tonic::Request<T>) -> TenantScope {
    request
        .extensions()
        .get::<TenantScope>()
        .cloned()
        .unwrap_or_default()
}

/// The tenants the caller may reconcile for without a fencing token; none
/// when the layer set none (fail closed).
pub(super) fn reconcile_tenants<T>(request: &tonic::Request<T>) -> TenantScope {
    request
        .extensions()
        .get::<ReconcileScope>()
        .map(|s| s.0.clone())
        .unwrap_or_default()
}

/// The transport identity of a request, as the access layer saw it.
pub(super) fn peer<T>(request: &tonic::Request<T>) -> String {
    request
        .extensions()
        .get::<PeerIdentity>()
        .map(ToString::to_string)
        .unwrap_or_default()
}
