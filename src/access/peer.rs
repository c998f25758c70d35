//! Who is calling, as the transport says (a client certificate's CN or
//! SAN, a Unix peer's uid), and the patterns a grant names callers by.

use std::fmt;

/// The transport identity of one connection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerIdentity {
    /// The client certificate's subject common name(s).
    pub common_names: Vec<String>,
    /// The client certificate's DNS and URI subject alternative names.
    pub sans: Vec<String>,
    /// The Unix peer's uid (Unix domain socket listeners).
    pub uid: Option<u32>,
}

impl PeerIdentity {
    /// The identity a DER client certificate names. The certificate was
    /// already verified against the configured client CA by the TLS layer;
    /// this only reads it. A certificate that cannot be parsed names nobody.
    #[must_use]
    pub fn from_certificate_der(der: &[u8]) -> Self {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return Self::default();
        };
        let common_names = cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok())
            .map(str::to_owned)
            .collect();
        let mut sans = Vec::new();
        if let Ok(Some(ext)) = cert.subject_alternative_name() {
            for name in &ext.value.general_names {
                match name {
                    x509_parser::extensions::GeneralName::DNSName(s)
                    | x509_parser::extensions::GeneralName::URI(s) => sans.push((*s).to_owned()),
                    _ => {}
                }
            }
        }
        Self {
            common_names,
            sans,
            uid: None,
        }
    }

    /// A Unix peer.
    #[must_use]
    pub fn unix(uid: Option<u32>) -> Self {
        Self {
            uid,
            ..Self::default()
        }
    }

    /// Whether the connection proved nothing about who is calling.
    #[must_use]
    pub fn is_anonymous(&self) -> bool {
        self.common_names.is_empty() && self.sans.is_empty() && self.uid.is_none()
    }
}

impl fmt::Display for PeerIdentity {
    /// A short label for logs and the audit log: the first SAN, else the
    /// first CN, else the uid, else `anonymous`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(san) = self.sans.first() {
            write!(f, "san:{san}")
        } else if let Some(cn) = self.common_names.first() {
            write!(f, "cn:{cn}")
        } else if let Some(uid) = self.uid {
            write!(f, "uid:{uid}")
        } else {
            f.write_str("anonymous")
        }
    }
}

/// Who a grant is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallerPattern {
    /// Every caller, even one the transport says nothing about.
    Any,
    /// A client certificate whose subject CN is exactly this.
    Cn(String),
    /// A client certificate with this DNS or URI SAN, exactly.
    San(String),
    /// A Unix peer with this uid.
    Uid(u32),
}

impl CallerPattern {
    /// Parses `any`, `cn:NAME`, `san:NAME` or `uid:N`.
    ///
    /// # Errors
    /// A message saying what forms are accepted.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not `any`, `cn:NAME`, `san:NAME` or `uid:N`");
        if text == "any" {
            return Ok(Self::Any);
        }
        let (kind, value) = text.split_once(':').ok_or_else(bad)?;
        if value.is_empty() {
            return Err(bad());
        }
        match kind {
            "cn" => Ok(Self::Cn(value.to_owned())),
            "san" => Ok(Self::San(value.to_owned())),
            "uid" => value.parse().map(Self::Uid).map_err(|_| bad()),
            _ => Err(bad()),
        }
    }

    pub(super) fn matches(&self, peer: &PeerIdentity) -> bool {
        match self {
            Self::Any => true,
            Self::Cn(cn) => peer.common_names.iter().any(|c| c == cn),
            Self::San(san) => peer.sans.iter().any(|s| s == san),
            Self::Uid(uid) => peer.uid == Some(*uid),
        }
    }
}
