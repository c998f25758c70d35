//! The tenants a caller may act for, as its grants give them, and the
//! tenants whose ledger records it may reconcile.

use std::collections::BTreeSet;

use crate::envelope::TenantNotGranted;

/// The tenants a caller may act for.
///
/// The default is no tenant at all: a request whose scope was never set (a
/// wiring mistake) is refused, never allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantScope {
    /// Every tenant: `tenants = ["*"]`, said explicitly, or open access.
    Any,
    /// Exactly these tenant ids.
    Only(BTreeSet<String>),
}

impl Default for TenantScope {
    fn default() -> Self {
        Self::Only(BTreeSet::new())
    }
}

impl TenantScope {
    /// The scope of `tenants` as configured: `*` anywhere is every tenant.
    #[must_use]
    pub fn of<I, S>(tenants: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut only = BTreeSet::new();
        for tenant in tenants {
            let tenant = tenant.into();
            if tenant == "*" {
                return Self::Any;
            }
            only.insert(tenant);
        }
        Self::Only(only)
    }

    /// Whether a request may run as `tenant`.
    #[must_use]
    pub fn allows(&self, tenant: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Only(tenants) => tenants.contains(tenant),
        }
    }

    /// The one check of decisions and the ledger, made on the tenant the
    /// request runs as (the established principal's).
    ///
    /// # Errors
    /// [`TenantNotGranted`] naming `tenant` when the scope does not hold it.
    pub fn admit(&self, tenant: &str) -> Result<(), TenantNotGranted> {
        if self.allows(tenant) {
            Ok(())
        } else {
            Err(TenantNotGranted::new(tenant))
        }
    }

    /// The tenants of either scope.
    #[must_use]
    pub fn union(self, other: Self) -> Self {
        match (self, other) {
            (Self::Any, _) | (_, Self::Any) => Self::Any,
            (Self::Only(mut a), Self::Only(b)) => {
                a.extend(b);
                Self::Only(a)
            }
        }
    }

    /// Whether no tenant at all is allowed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        matches!(self, Self::Only(t) if t.is_empty())
    }
}

/// The tenants whose ledger records a caller may reconcile without the
/// attempt's fencing token: its `reconcile` grants' tenants (every tenant
/// under open access). Set by the access layer on every ledger request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReconcileScope(pub TenantScope);
