//! The DNS-rebinding guard: which listeners it holds on
//! ([`Transport`]), and what an HTTP/1.x request must name there
//! ([`admits_http1`]).

/// What a listener is, as far as the DNS-rebinding guard cares
/// ([`AccessPolicy::rebinding_guard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// TCP: on a loopback address or not, with TLS or plaintext.
    Tcp {
        /// The bound address is a loopback one.
        loopback: bool,
        /// The listener speaks TLS.
        tls: bool,
    },
    /// A Unix domain socket.
    Unix,
}

/// The DNS-rebinding guard, where it holds
/// ([`AccessPolicy::rebinding_guard`]). A loopback listener trusts every
/// process that can reach its port, and a browser can reach it too: a page
/// of `evil.example` whose name is made to resolve to 127.0.0.1 sends
/// requests that are same-origin to the browser, so CORS never stops them.
/// Over HTTP/1.x (the only version a browser speaks to a plain-text
/// listener; h2c is never a browser) such a request carries the page's host
/// in `Host` and its origin in `Origin`. So an HTTP/1.x request must name a
/// loopback host (`localhost`, 127.0.0.0/8, `[::1]`, with any port; a
/// missing `Host` is refused), and an `Origin`, when sent, must be a
/// loopback origin or one of the configured gRPC-Web origins
/// (`allowed_origins`, exact).
///
/// # Errors
///
/// [`BrowserRefusal`] names which header was refused.
pub fn admits_http1(
    host: Option<&str>,
    origin: Option<&str>,
    allowed_origins: &[String],
) -> Result<(), BrowserRefusal> {
    if !host.is_some_and(is_loopback_authority) {
        return Err(BrowserRefusal::Host);
    }
    match origin {
        None => Ok(()),
        Some(o) if allowed_origins.iter().any(|a| a == o) || is_loopback_origin(o) => Ok(()),
        Some(_) => Err(BrowserRefusal::Origin),
    }
}

/// Which header of an HTTP/1.x request the DNS-rebinding guard refused
/// ([`admits_http1`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrowserRefusal {
    /// `Host` missing or not a loopback name.
    Host,
    /// `Origin` neither loopback nor configured.
    Origin,
}

impl BrowserRefusal {
    /// The stable reason, for `ErrorInfo` and the metrics.
    #[must_use]
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Host => "host_not_loopback",
            Self::Origin => "origin_not_allowed",
        }
    }
}

/// Whether an authority (`host[:port]`) names the loopback interface:
/// `localhost` (any case, a trailing dot allowed), an IPv4 address in
/// 127.0.0.0/8, or `[::1]`. Anything else, a name that merely resolves
/// to loopback included, is not: that name is what rebinding controls.
fn is_loopback_authority(authority: &str) -> bool {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return false;
        };
        if !(after.is_empty() || is_port(after)) {
            return false;
        }
        return inside
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|a| a.is_loopback());
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) if is_port(&format!(":{port}")) => host,
            Some(_) => return false,
            None => authority,
        }
    };
    let name = host.strip_suffix('.').unwrap_or(host);
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback())
}

/// `:` followed by 1 to 5 digits.
fn is_port(text: &str) -> bool {
    text.strip_prefix(':')
        .is_some_and(|p| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether an `Origin` is `http://` or `https://` and a loopback authority.
fn is_loopback_origin(origin: &str) -> bool {
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(is_loopback_authority)
}
