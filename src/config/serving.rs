//! The settings of the listener and of the decisions themselves, each
//! validated with the key that is wrong named in the error.

use std::path::PathBuf;
use std::time::Duration;

use super::raw::{RawDecisions, RawLimits, RawSessions};
use super::{ConfigError, DEFAULT_LISTEN, ListenAddr, invalid};
use crate::decision::AuthorizerConfig;
use crate::decode::Limits;

/// `listen`: `host:port` or `unix:/path`, the default when unset.
pub(super) fn listen_addr(listen: Option<String>) -> Result<ListenAddr, ConfigError> {
    let listen = listen.unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
    Ok(match listen.strip_prefix("unix:") {
        Some(p) if !p.is_empty() => ListenAddr::Unix(PathBuf::from(p)),
        Some(_) => {
            return Err(ConfigError::Invalid {
                key: "listen",
                reason: "`unix:` needs a path".into(),
            });
        }
        None => {
            if listen.parse::<std::net::SocketAddr>().is_err() {
                return Err(ConfigError::Invalid {
                    key: "listen",
                    reason: format!("`{listen}` is not host:port or unix:/path"),
                });
            }
            ListenAddr::Tcp(listen)
        }
    })
}

/// `[limits]`' argument and entity limits, `[decisions]` and `[sessions]`.
pub(super) fn authorizer_config(
    limits: &RawLimits,
    decisions: &RawDecisions,
    sessions: &RawSessions,
) -> Result<AuthorizerConfig, ConfigError> {
    let mut authorizer = AuthorizerConfig::default();
    let defaults = Limits::default();
    authorizer.limits = Limits {
        max_bytes: limits.max_argument_bytes.unwrap_or(defaults.max_bytes),
        max_depth: limits.max_depth.unwrap_or(defaults.max_depth),
    };
    authorizer.entity_limits = Limits {
        max_bytes: limits
            .max_entities_bytes
            .unwrap_or(authorizer.entity_limits.max_bytes),
        max_depth: authorizer.limits.max_depth,
    };
    if authorizer.limits.max_bytes == 0
        || authorizer.limits.max_depth == 0
        || authorizer.entity_limits.max_bytes == 0
    {
        return Err(ConfigError::Invalid {
            key: "limits",
            reason: "limits must be positive".into(),
        });
    }
    if let Some(ms) = decisions.deadline_margin_ms {
        authorizer.deadline_margin = Duration::from_millis(ms);
    }
    if let Some(s) = decisions.pending_approval_ttl_seconds {
        if s == 0 {
            return Err(ConfigError::Invalid {
                key: "decisions.pending_approval_ttl_seconds",
                reason: "must be positive".into(),
            });
        }
        authorizer.pending_approval_ttl = Duration::from_secs(s);
    }
    for (key, value, slot) in [
        (
            "decisions.max_pending_approvals_per_subject",
            decisions.max_pending_approvals_per_subject,
            &mut authorizer.pending_limits.per_subject,
        ),
        (
            "decisions.max_pending_approvals_per_tenant",
            decisions.max_pending_approvals_per_tenant,
            &mut authorizer.pending_limits.per_tenant,
        ),
    ] {
        match value {
            Some(0) => {
                return Err(ConfigError::Invalid {
                    key,
                    reason: "must be positive".into(),
                });
            }
            Some(n) => *slot = n,
            None => {}
        }
    }
    if let Some(s) = sessions.idle_seconds {
        if s == 0 || s > crate::budgets::MAX_WINDOW_SECONDS {
            return Err(ConfigError::Invalid {
                key: "sessions.idle_seconds",
                reason: format!("must be 1 to {}", crate::budgets::MAX_WINDOW_SECONDS),
            });
        }
        authorizer.session_idle = Duration::from_secs(s);
    }
    if let Some(n) = decisions.max_violations {
        authorizer.violation_cap = n.max(1);
    }
    Ok(authorizer)
}

/// `unix_socket_mode`: octal, owner read-write, nothing for others.
pub(super) fn unix_socket_mode(mode: Option<String>) -> Result<u32, ConfigError> {
    Ok(match mode {
        None => 0o600,
        Some(text) => {
            let mode = u32::from_str_radix(&text, 8)
                .map_err(|_| invalid("unix_socket_mode", format!("`{text}` is not octal")))?;
            if mode & !0o770 != 0 || mode & 0o600 != 0o600 {
                return Err(invalid(
                    "unix_socket_mode",
                    "must give the owner read and write and never anything to others (e.g. 0600, 0660)",
                ));
            }
            mode
        }
    })
}

/// `[grpc_web] allowed_origins`: exact origins only.
pub(super) fn check_origins(origins: &[String]) -> Result<(), ConfigError> {
    for origin in origins {
        let ok = (origin.starts_with("https://") || origin.starts_with("http://"))
            && !origin.contains('*')
            && !origin.ends_with('/');
        if !ok {
            return Err(invalid(
                "grpc_web.allowed_origins",
                format!("`{origin}` is not an exact origin like https://approvals.example.com"),
            ));
        }
    }
    Ok(())
}
