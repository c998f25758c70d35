//! A key set fetched from the identity provider, that rotates (DESIGN §8;
//! issue 18 point 9): `[identity] jwks_url`, or OIDC discovery from the
//! issuer (`/.well-known/openid-configuration`, its `jwks_uri`).
//!
//! The set is fetched once at start (a sidecar that cannot fetch it does
//! not start), then again when its `Cache-Control: max-age` runs out
//! (bounded by the configured minimum and maximum) and when a token names
//! a key the set lacks — at most once per minimum interval, so a flood of
//! made-up `kid`s cannot hammer the provider. A fetch that fails, or that
//! returns a set that does not load, keeps the last good set and is tried
//! again after the minimum interval. A key removed from the published set
//! stops verifying at the next fetch, without a restart.
//!
//! Only `https://` URLs are fetched, or `http://` to a loopback host (a
//! local provider, tests). Nothing fetched is logged beyond key ids.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::{Notify, watch};

use super::token::{KeySet, KeySource, MAX_JWKS_BYTES, TokenError};

/// How long one fetch (connect, headers, body) may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The refresh interval when the response names no `max-age` (bounded by
/// the configured minimum and maximum like any other).
const DEFAULT_MAX_AGE: Duration = Duration::from_secs(300);

/// Where the key set is published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksLocation {
    /// The key set's own URL.
    Url(String),
    /// OIDC discovery: `{issuer}/.well-known/openid-configuration` names it.
    Discovery { issuer: String },
}

/// `[identity]`'s remote key set settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteJwksConfig {
    pub location: JwksLocation,
    /// The shortest time between two fetches, whatever the cache headers
    /// say or unknown keys ask (default 60 s).
    pub min_refresh: Duration,
    /// The longest time a fetched set is used before it is fetched again
    /// (default 1 h).
    pub max_refresh: Duration,
}

impl RemoteJwksConfig {
    pub const DEFAULT_MIN_REFRESH: Duration = Duration::from_secs(60);
    pub const DEFAULT_MAX_REFRESH: Duration = Duration::from_secs(3600);
}

/// Why the remote key set could not be had.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RemoteKeysError {
    #[error("`{url}` is not an https:// URL (http:// is allowed only to a loopback host)")]
    InsecureUrl { url: String },
    #[error("fetching `{url}`: {detail}")]
    Fetch { url: String, detail: String },
    #[error("`{url}` answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("`{url}` sent more than 1 MiB")]
    TooLarge { url: String },
    #[error("the OIDC discovery document at `{url}` {detail}")]
    Discovery { url: String, detail: String },
    #[error("the key set at `{url}`: {source}")]
    KeySet {
        url: String,
        #[source]
        source: TokenError,
    },
}

/// A key set that is fetched again and again; see the module doc.
#[derive(Debug)]
pub struct RemoteKeySet {
    url: String,
    current: ArcSwap<KeySet>,
    /// Wakes the refresh task early (an unknown key).
    wake: Arc<Notify>,
    /// The number of fetches that have ended (successful or not).
    fetched: watch::Sender<u64>,
    /// When the last fetch an unknown key asked for started.
    last_asked: Mutex<Option<Instant>>,
    min_refresh: Duration,
    client: reqwest::Client,
}

impl RemoteKeySet {
    /// Fetches the key set (after discovery, when asked) and starts the task
    /// that keeps it fresh; the task ends when the set is dropped.
    ///
    /// # Errors
    /// [`RemoteKeysError`] when the URL is not allowed, or the discovery
    /// document or the key set cannot be fetched or do not load.
    pub async fn start(config: &RemoteJwksConfig) -> Result<Arc<Self>, RemoteKeysError> {
        // reqwest's rustls has no crypto provider of its own here: ring, as
        // tonic's TLS and the MCP client use.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| RemoteKeysError::Fetch {
                url: String::new(),
                detail: e.to_string(),
            })?;
        let url = match &config.location {
            JwksLocation::Url(url) => allowed(url)?,
            JwksLocation::Discovery { issuer } => discover(&client, issuer).await?,
        };
        let (keys, max_age) = fetch(&client, &url).await?;
        let set = Arc::new(Self {
            url,
            current: ArcSwap::from_pointee(keys),
            wake: Arc::new(Notify::new()),
            fetched: watch::Sender::new(1),
            last_asked: Mutex::new(None),
            min_refresh: config.min_refresh,
            client,
        });
        let first = bounded(max_age, config);
        tokio::spawn(refresh_loop(
            Arc::downgrade(&set),
            Arc::clone(&set.wake),
            config.clone(),
            first,
        ));
        Ok(set)
    }

    /// The URL the key set is fetched from (after discovery).
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// One fetch; on success the set in force is replaced.
    async fn refresh(&self) -> Result<Option<Duration>, RemoteKeysError> {
        let result = fetch(&self.client, &self.url).await;
        let outcome = match result {
            Ok((keys, max_age)) => {
                let ids: Vec<String> = keys
                    .key_ids()
                    .map(|k| k.unwrap_or("(no kid)").chars().take(64).collect())
                    .collect();
                tracing::debug!(keys = ?ids, "identity key set fetched");
                self.current.store(Arc::new(keys));
                Ok(max_age)
            }
            Err(e) => Err(e),
        };
        self.fetched.send_modify(|n| *n = n.wrapping_add(1));
        outcome
    }
}

impl KeySource for RemoteKeySet {
    fn current(&self) -> Arc<KeySet> {
        self.current.load_full()
    }

    fn refresh_for_unknown_key(&self) -> Option<watch::Receiver<u64>> {
        let now = Instant::now();
        {
            let Ok(mut last) = self.last_asked.lock() else {
                return None;
            };
            if last.is_some_and(|t| now.duration_since(t) < self.min_refresh) {
                return None;
            }
            *last = Some(now);
        }
        let receiver = self.fetched.subscribe();
        self.wake.notify_one();
        Some(receiver)
    }
}

/// Fetches the set again when its time is up or an unknown key asks, until
/// the set is dropped.
async fn refresh_loop(
    set: Weak<RemoteKeySet>,
    wake: Arc<Notify>,
    config: RemoteJwksConfig,
    first: Duration,
) {
    let mut next = first;
    loop {
        tokio::select! {
            () = tokio::time::sleep(next) => {}
            () = wake.notified() => {}
        }
        let Some(set) = set.upgrade() else {
            return;
        };
        next = match set.refresh().await {
            Ok(max_age) => bounded(max_age, &config),
            Err(e) => {
                // The last good set stays in force.
                tracing::warn!(error = %e, "the identity key set could not be fetched; the last good set stays in force");
                config.min_refresh
            }
        };
    }
}

/// The response's `max-age`, within the configured bounds.
fn bounded(max_age: Option<Duration>, config: &RemoteJwksConfig) -> Duration {
    max_age.unwrap_or(DEFAULT_MAX_AGE).clamp(
        config.min_refresh,
        config.max_refresh.max(config.min_refresh),
    )
}

/// `url` if it may be fetched: https, or http to a loopback host.
fn allowed(url: &str) -> Result<String, RemoteKeysError> {
    let insecure = || RemoteKeysError::InsecureUrl {
        url: url.to_owned(),
    };
    let parsed = reqwest::Url::parse(url).map_err(|_| insecure())?;
    let host = parsed.host_str().ok_or_else(insecure)?;
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match parsed.scheme() {
        "https" => Ok(url.to_owned()),
        "http" if loopback => Ok(url.to_owned()),
        _ => Err(insecure()),
    }
}

/// The `jwks_uri` of the issuer's OIDC discovery document, whose `issuer`
/// must be the configured one exactly (OpenID Connect Discovery §4.3).
async fn discover(client: &reqwest::Client, issuer: &str) -> Result<String, RemoteKeysError> {
    let url = allowed(&format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    ))?;
    let (body, _) = get(client, &url).await?;
    let wrong = |detail: &str| RemoteKeysError::Discovery {
        url: url.clone(),
        detail: detail.to_owned(),
    };
    let document: serde_json::Value =
        serde_json::from_slice(&body).map_err(|_| wrong("is not JSON"))?;
    if document.get("issuer").and_then(serde_json::Value::as_str) != Some(issuer) {
        return Err(wrong("names another issuer than the configured one"));
    }
    let jwks_uri = document
        .get("jwks_uri")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| wrong("has no string `jwks_uri`"))?;
    allowed(jwks_uri)
}

/// One GET of the key set: the set, and the response's `max-age`.
async fn fetch(
    client: &reqwest::Client,
    url: &str,
) -> Result<(KeySet, Option<Duration>), RemoteKeysError> {
    let (body, max_age) = get(client, url).await?;
    let text = String::from_utf8(body).map_err(|_| RemoteKeysError::KeySet {
        url: url.to_owned(),
        source: TokenError::Malformed {
            detail: "the key set is not UTF-8",
        },
    })?;
    let keys = KeySet::from_jwks_json(&text).map_err(|source| RemoteKeysError::KeySet {
        url: url.to_owned(),
        source,
    })?;
    Ok((keys, max_age))
}

/// A GET of at most [`MAX_JWKS_BYTES`]: the body and the `max-age`.
async fn get(
    client: &reqwest::Client,
    url: &str,
) -> Result<(Vec<u8>, Option<Duration>), RemoteKeysError> {
    let failed = |e: reqwest::Error| RemoteKeysError::Fetch {
        url: url.to_owned(),
        // Without the URL again: reqwest's message names it.
        detail: e.without_url().to_string(),
    };
    let mut response = client
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(failed)?;
    if !response.status().is_success() {
        return Err(RemoteKeysError::Status {
            url: url.to_owned(),
            status: response.status().as_u16(),
        });
    }
    let max_age = response
        .headers()
        .get_all(reqwest::header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(max_age);
    let limit = usize::try_from(MAX_JWKS_BYTES).unwrap_or(usize::MAX);
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        if body.len().saturating_add(chunk.len()) > limit {
            return Err(RemoteKeysError::TooLarge {
                url: url.to_owned(),
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, max_age))
}

/// The freshness lifetime a `Cache-Control` value gives (RFC 9111 §5.2.2):
/// `max-age`, or zero for `no-cache` / `no-store`.
fn max_age(value: &str) -> Option<Duration> {
    value.split(',').map(str::trim).find_map(|directive| {
        let lower = directive.to_ascii_lowercase();
        if lower == "no-cache" || lower == "no-store" {
            return Some(Duration::ZERO);
        }
        let seconds = lower.strip_prefix("max-age=")?;
        seconds
            .trim_matches('"')
            .parse::<u64>()
            .ok()
            .map(Duration::from_secs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_is_read_from_cache_control() {
        assert_eq!(
            max_age("public, max-age=120"),
            Some(Duration::from_secs(120))
        );
        assert_eq!(max_age("MAX-AGE=\"7\""), Some(Duration::from_secs(7)));
        assert_eq!(max_age("no-store"), Some(Duration::ZERO));
        assert_eq!(max_age("public"), None);
        assert_eq!(max_age("max-age=-1"), None);
    }

    #[test]
    fn the_interval_stays_within_its_bounds() {
        let config = RemoteJwksConfig {
            location: JwksLocation::Url("https://idp.test/jwks".into()),
            min_refresh: Duration::from_secs(10),
            max_refresh: Duration::from_secs(100),
        };
        assert_eq!(
            bounded(Some(Duration::ZERO), &config),
            Duration::from_secs(10)
        );
        assert_eq!(
            bounded(Some(Duration::from_secs(50)), &config),
            Duration::from_secs(50)
        );
        assert_eq!(
            bounded(Some(Duration::from_secs(86_400)), &config),
            Duration::from_secs(100)
        );
        assert_eq!(bounded(None, &config), Duration::from_secs(100));
    }

    #[test]
    fn only_https_or_loopback_http_is_fetched() {
        for ok in [
            "https://idp.example/jwks",
            "http://127.0.0.1:8080/jwks",
            "http://localhost/jwks",
            "http://[::1]:9/jwks",
        ] {
            assert_eq!(allowed(ok).unwrap(), ok);
        }
        for bad in [
            "http://idp.example/jwks",
            "http://10.0.0.1/jwks",
            "file:///etc/jwks.json",
            "not a url",
        ] {
            assert!(
                matches!(allowed(bad), Err(RemoteKeysError::InsecureUrl { .. })),
                "{bad}"
            );
        }
    }
}
