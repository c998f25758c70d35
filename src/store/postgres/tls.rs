//! TLS to PostgreSQL with rustls (issue 18 point 6), as libpq's `sslmode`
//! says (<https://www.postgresql.org/docs/current/libpq-ssl.html>):
//!
//! - `disable`, `prefer`: no TLS (as before: a Unix socket or a private
//!   network);
//! - `require`: TLS, the server's certificate not checked (libpq's
//!   `require`) — or, when a CA file is given, checked as `verify-ca`;
//! - `verify-ca`: TLS, the certificate chain verified against the CA file;
//! - `verify-full`: TLS, the chain verified and the certificate naming the
//!   host connected to.
//!
//! Every TLS mode refuses a server that offers no TLS (the client asks for
//! it and gives up on a no). The CA file comes from the URL's `sslrootcert`
//! (or `[store] ca_file`, which the configuration folds into the URL).
//! tokio-postgres knows neither `verify-*` nor `sslrootcert`, so both are
//! taken out of the URL here and tokio-postgres is told `require`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{VerifierBuilderError, WebPkiServerVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::StoreError;

/// What `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// How connections are made: plain, or through rustls.
#[derive(Clone)]
pub(super) enum Tls {
    Off,
    Rustls(MakeRustlsConnect),
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Off => "Off",
            Self::Rustls(_) => "Rustls",
        })
    }
}

/// The URL without `sslrootcert`, with `sslmode=verify-*` told as
/// `require` (what tokio-postgres parses), and the mode and CA file asked.
///
/// # Errors
/// [`StoreError::PostgresUrl`] for an `sslmode` PostgreSQL does not know
/// (the URL itself is never quoted: it may hold a password).
pub(super) fn split_url(url: &str) -> Result<(String, SslMode, Option<PathBuf>), StoreError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), SslMode::Prefer, None));
    };
    let mut mode = SslMode::Prefer;
    let mut ca = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => {
                mode = match value {
                    "disable" => SslMode::Disable,
                    "allow" | "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    _ => {
                        return Err(StoreError::PostgresUrl(
                            "`sslmode` is not one of disable, prefer, require, verify-ca, verify-full"
                                .into(),
                        ));
                    }
                };
                let told = match mode {
                    SslMode::Disable => "disable",
                    SslMode::Prefer => "prefer",
                    _ => "require",
                };
                kept.push(format!("sslmode={told}"));
            }
            "sslrootcert" => ca = Some(PathBuf::from(percent_decoded(value)?)),
            _ => kept.push(pair.to_owned()),
        }
    }
    let rewritten = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rewritten, mode, ca))
}

/// The connector for `mode`, verifying against `ca` where it asks to.
///
/// # Errors
/// [`StoreError::PostgresUrl`] when a `verify-*` mode has no CA file, or
/// the file cannot be read or holds no certificate.
pub(super) fn connector(mode: SslMode, ca: Option<&Path>) -> Result<Tls, StoreError> {
    let mode = match (mode, ca) {
        (SslMode::Disable | SslMode::Prefer, _) => return Ok(Tls::Off),
        // libpq: `require` with a root certificate verifies the chain.
        (SslMode::Require, Some(_)) => SslMode::VerifyCa,
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(StoreError::PostgresUrl(
                "sslmode=verify-ca and verify-full need a CA file: `sslrootcert=` in the URL or `[store] ca_file`"
                    .into(),
            ));
        }
        (other, _) => other,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::PostgresUrl(format!("TLS: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, ca) {
        (SslMode::VerifyCa | SslMode::VerifyFull, Some(ca)) => {
            let roots = Arc::new(roots(ca)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
                .build()
                .map_err(|e: VerifierBuilderError| StoreError::PostgresUrl(format!("TLS: {e}")))?;
            if mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(ChainOnly(webpki))
            }
        }
        _ => Arc::new(Unchecked(provider)),
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Tls::Rustls(MakeRustlsConnect::new(config)))
}

/// The CA certificates of a PEM file.
fn roots(path: &Path) -> Result<RootCertStore, StoreError> {
    let unreadable =
        |why: &str| StoreError::PostgresUrl(format!("the CA file `{}` {why}", path.display()));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|_| unreadable("cannot be read"))?
        .collect::<Result<_, _>>()
        .map_err(|_| unreadable("is not PEM"))?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(unreadable("holds no usable certificate"));
    }
    Ok(roots)
}

fn percent_decoded(value: &str) -> Result<String, StoreError> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    StoreError::PostgresUrl("`sslrootcert` is not percent-encoded correctly".into())
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| StoreError::PostgresUrl("`sslrootcert` is not UTF-8".into()))
}

/// `verify-ca`: the chain must lead to the CA; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` without a CA (libpq's meaning): encrypted, the certificate
/// not checked; the handshake's signatures still are.
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_the_url() {
        let (url, mode, ca) = split_url(
            "postgres://u:p@db.internal:5432/toolgate?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://u:p@db.internal:5432/toolgate?application_name=x&sslmode=require"
        );
        assert_eq!(mode, SslMode::VerifyFull);
        assert_eq!(ca, Some(PathBuf::from("/etc/ca.pem")));
        let (url, mode, ca) = split_url("postgres://u@h/db").unwrap();
        assert_eq!(
            (url.as_str(), mode, ca),
            ("postgres://u@h/db", SslMode::Prefer, None)
        );
        let (url, mode, _) = split_url("postgres://u@h/db?sslmode=verify-ca").unwrap();
        assert_eq!(
            (url.as_str(), mode),
            ("postgres://u@h/db?sslmode=require", SslMode::VerifyCa)
        );
        let e = split_url("postgres://u:secret@h/db?sslmode=verify-everything").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn verify_modes_need_a_ca_file() {
        for mode in [SslMode::VerifyCa, SslMode::VerifyFull] {
            let e = connector(mode, None).unwrap_err();
            assert!(e.to_string().contains("need a CA file"), "{e}");
        }
        assert!(matches!(connector(SslMode::Disable, None), Ok(Tls::Off)));
        assert!(matches!(
            connector(SslMode::Require, None),
            Ok(Tls::Rustls(_))
        ));
        let e = connector(SslMode::VerifyFull, Some(Path::new("/no/such/ca.pem"))).unwrap_err();
        assert!(e.to_string().contains("cannot be read"), "{e}");
    }
}
