//! Execution tickets (DESIGN §5, "a record belongs to a decision"): the
//! proof an ALLOW decision hands its executor, without which
//! `BeginExecution` writes nothing.
//!
//! A ticket is `tgx1.<key version>.<expires at, Unix ms>.<MAC>`: an
//! HMAC-SHA256 (base64url, no padding) under a versioned server key over
//! the tenant, subject, idempotency key, arguments hash, tool, expiry and
//! key version, each length-prefixed so no two field lists encode alike.
//! Nothing is stored per ticket: any replica holding the key checks it, and
//! a ticket for another tenant, subject, key, hash or tool fails its MAC
//! exactly like a forged one. The keys live in the store
//! (`ledger_ticket_keys`), so every replica of one database shares them;
//! the newest version signs, every stored version verifies, and a ticket
//! naming a version this replica has not loaded makes it reload the keys
//! once (a rotation made by another replica). Pure: no IO, no clock.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;

use crate::clock::UnixMillis;

/// The prefix of every ticket of this format.
const PREFIX: &str = "tgx1";
/// Domain separation: a MAC of this format is never valid for anything else.
const DOMAIN: &[u8] = b"toolgate execution ticket v1";
/// Bytes of a key.
pub const KEY_BYTES: usize = 32;
/// The longest ticket accepted (ours are about 70 bytes).
const MAX_TICKET_BYTES: usize = 256;

/// One version of the ticket key.
#[derive(Clone, PartialEq, Eq)]
pub struct TicketKey {
    /// 1 for the first key; a rotation adds the next.
    pub version: u32,
    pub secret: [u8; KEY_BYTES],
}

impl std::fmt::Debug for TicketKey {
    /// Never shows the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketKey")
            .field("version", &self.version)
            .field("secret", &"[REDACTED]")
            .finish()
    }
}

impl TicketKey {
    /// A new random key of `version`.
    ///
    /// # Errors
    /// When the operating system has no randomness to give.
    pub fn generate(version: u32) -> Result<Self, getrandom::Error> {
        let mut secret = [0u8; KEY_BYTES];
        getrandom::fill(&mut secret)?;
        Ok(Self { version, secret })
    }
}

/// What a ticket is bound to: one allowed call of one principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TicketClaims<'a> {
    pub tenant_id: &'a str,
    pub subject_id: &'a str,
    pub idempotency_key: &'a str,
    pub arguments_sha256: &'a str,
    pub tool: &'a str,
}

/// Why a ticket was refused: the stable `details.reason` of the
/// `unauthorized` refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TicketRefusal {
    /// No ticket was sent.
    Missing,
    /// It was valid once; its time is over.
    Expired,
    /// Malformed, signed by no key we hold, or for another call.
    Invalid,
}

impl TicketRefusal {
    /// The stable reason.
    #[must_use]
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Missing => "ticket_missing",
            Self::Expired => "ticket_expired",
            Self::Invalid => "ticket_invalid",
        }
    }
}

/// The ticket keys one replica holds, newest last.
#[derive(Debug, Clone)]
pub struct TicketKeys {
    keys: Vec<TicketKey>,
}

/// A ticket's parts, before its MAC is checked.
struct Parsed<'a> {
    version: u32,
    expires_at: UnixMillis,
    mac: &'a str,
}

fn parse(ticket: &str) -> Option<Parsed<'_>> {
    if ticket.len() > MAX_TICKET_BYTES {
        return None;
    }
    let mut parts = ticket.split('.');
    let (prefix, version, expires_at, mac) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if prefix != PREFIX || parts.next().is_some() {
        return None;
    }
    // Canonical numbers only: one ticket has one spelling.
    let number = |s: &str| {
        (!s.starts_with('0') || s == "0")
            .then_some(())
            .and(s.parse().ok())
    };
    Some(Parsed {
        version: number(version).and_then(|v: u64| u32::try_from(v).ok())?,
        expires_at: number(expires_at).and_then(|v: u64| i64::try_from(v).ok())?,
        mac,
    })
}

impl TicketKeys {
    /// The keys `keys` (in any order); `None` when there is none.
    #[must_use]
    pub fn new(mut keys: Vec<TicketKey>) -> Option<Self> {
        keys.sort_by_key(|k| k.version);
        keys.dedup_by_key(|k| k.version);
        (!keys.is_empty()).then_some(Self { keys })
    }

    /// The version tickets are signed with now.
    #[must_use]
    pub fn current_version(&self) -> u32 {
        self.keys.last().map_or(0, |k| k.version)
    }

    fn key(&self, version: u32) -> Option<&TicketKey> {
        self.keys.iter().find(|k| k.version == version)
    }

    /// A ticket for `claims`, valid until `expires_at`, under the newest key.
    #[must_use]
    pub fn issue(&self, claims: &TicketClaims<'_>, expires_at: UnixMillis) -> String {
        let Some(key) = self.keys.last() else {
            return String::new();
        };
        let expires_at = expires_at.max(0);
        let mac = hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, &key.secret),
            &message(claims, expires_at, key.version),
        );
        format!(
            "{PREFIX}.{}.{expires_at}.{}",
            key.version,
            URL_SAFE_NO_PAD.encode(mac.as_ref())
        )
    }

    /// Whether `ticket` names a key version this set does not hold (the
    /// caller may reload the keys once, then check again).
    #[must_use]
    pub fn lacks_version_of(&self, ticket: &str) -> bool {
        parse(ticket).is_some_and(|p| self.key(p.version).is_none())
    }

    /// Checks `ticket` for `claims` at `now`: its MAC first (in constant
    /// time), so a forged or mismatched ticket is `Invalid` whatever its
    /// expiry says, then its expiry.
    ///
    /// # Errors
    /// The [`TicketRefusal`].
    pub fn verify(
        &self,
        ticket: &str,
        claims: &TicketClaims<'_>,
        now: UnixMillis,
    ) -> Result<(), TicketRefusal> {
        if ticket.is_empty() {
            return Err(TicketRefusal::Missing);
        }
        let parsed = parse(ticket).ok_or(TicketRefusal::Invalid)?;
        let key = self.key(parsed.version).ok_or(TicketRefusal::Invalid)?;
        let mac = URL_SAFE_NO_PAD
            .decode(parsed.mac)
            .map_err(|_| TicketRefusal::Invalid)?;
        hmac::verify(
            &hmac::Key::new(hmac::HMAC_SHA256, &key.secret),
            &message(claims, parsed.expires_at, parsed.version),
            &mac,
        )
        .map_err(|_| TicketRefusal::Invalid)?;
        if parsed.expires_at <= now {
            return Err(TicketRefusal::Expired);
        }
        Ok(())
    }
}

/// The bytes a MAC covers: the domain, every claim length-prefixed, the
/// expiry and the key version.
fn message(claims: &TicketClaims<'_>, expires_at: UnixMillis, version: u32) -> Vec<u8> {
    let fields = [
        claims.tenant_id,
        claims.subject_id,
        claims.idempotency_key,
        claims.arguments_sha256,
        claims.tool,
    ];
    let mut out =
        Vec::with_capacity(DOMAIN.len() + 64 + fields.iter().map(|f| f.len() + 8).sum::<usize>());
    out.extend_from_slice(DOMAIN);
    for field in fields {
        out.extend_from_slice(&(field.len() as u64).to_be_bytes());
        out.extend_from_slice(field.as_bytes());
    }
    out.extend_from_slice(&expires_at.to_be_bytes());
    out.extend_from_slice(&version.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLAIMS: TicketClaims<'static> = TicketClaims {
        tenant_id: "acme",
        subject_id: "alice",
        idempotency_key: "issue_refund:abc",
        arguments_sha256: "00",
        tool: "issue_refund",
    };

    fn keys() -> TicketKeys {
        TicketKeys::new(vec![TicketKey {
            version: 1,
            secret: [7; KEY_BYTES],
        }])
        .unwrap()
    }

    #[test]
    fn a_ticket_verifies_for_its_own_call_until_it_expires() {
        let keys = keys();
        let t = keys.issue(&CLAIMS, 1_000);
        assert!(t.starts_with("tgx1.1.1000."), "{t}");
        assert_eq!(keys.verify(&t, &CLAIMS, 999), Ok(()));
        assert_eq!(keys.verify(&t, &CLAIMS, 1_000), Err(TicketRefusal::Expired));
        assert_eq!(keys.verify("", &CLAIMS, 0), Err(TicketRefusal::Missing));
    }

    #[test]
    fn every_bound_field_and_the_expiry_are_covered() {
        let keys = keys();
        let t = keys.issue(&CLAIMS, 1_000);
        let others = [
            TicketClaims {
                tenant_id: "globex",
                ..CLAIMS
            },
            TicketClaims {
                subject_id: "mallory",
                ..CLAIMS
            },
            TicketClaims {
                idempotency_key: "issue_refund:abd",
                ..CLAIMS
            },
            TicketClaims {
                arguments_sha256: "01",
                ..CLAIMS
            },
            TicketClaims {
                tool: "delete_account",
                ..CLAIMS
            },
            // Shifting a byte between two fields changes the message too.
            TicketClaims {
                tenant_id: "acm",
                subject_id: "ealice",
                ..CLAIMS
            },
        ];
        for other in others {
            assert_eq!(
                keys.verify(&t, &other, 0),
                Err(TicketRefusal::Invalid),
                "{other:?}"
            );
        }
        let later = t.replacen(".1000.", ".9000.", 1);
        assert_eq!(keys.verify(&later, &CLAIMS, 0), Err(TicketRefusal::Invalid));
        let padded = t.replacen(".1000.", ".01000.", 1);
        assert_eq!(
            keys.verify(&padded, &CLAIMS, 0),
            Err(TicketRefusal::Invalid)
        );
        for junk in [
            "tgx1",
            "tgx1.1.1000",
            "x.1.1000.AAAA",
            &format!("{t}.x"),
            "tgx1.1.1000.!!",
        ] {
            assert_eq!(
                keys.verify(junk, &CLAIMS, 0),
                Err(TicketRefusal::Invalid),
                "{junk}"
            );
        }
    }

    #[test]
    fn the_newest_key_signs_and_every_held_key_verifies() {
        let old = keys();
        let t_old = old.issue(&CLAIMS, 1_000);
        let rotated = TicketKeys::new(vec![
            TicketKey {
                version: 2,
                secret: [9; KEY_BYTES],
            },
            TicketKey {
                version: 1,
                secret: [7; KEY_BYTES],
            },
        ])
        .unwrap();
        assert_eq!(rotated.current_version(), 2);
        let t_new = rotated.issue(&CLAIMS, 1_000);
        assert!(t_new.starts_with("tgx1.2."), "{t_new}");
        assert_eq!(rotated.verify(&t_old, &CLAIMS, 0), Ok(()));
        assert!(old.lacks_version_of(&t_new));
        assert!(!rotated.lacks_version_of(&t_old));
        assert_eq!(old.verify(&t_new, &CLAIMS, 0), Err(TicketRefusal::Invalid));
        // Another deployment's key of the same version verifies nothing.
        let stranger = TicketKeys::new(vec![TicketKey {
            version: 1,
            secret: [8; KEY_BYTES],
        }])
        .unwrap();
        assert_eq!(
            stranger.verify(&t_old, &CLAIMS, 0),
            Err(TicketRefusal::Invalid)
        );
        assert!(TicketKeys::new(Vec::new()).is_none());
        assert!(!format!("{:?}", rotated).contains('9'));
    }
}
