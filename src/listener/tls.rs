//! TLS on the listener: rustls with ALPN `h2` and `http/1.1`, so that
//! gRPC clients negotiate h2 and an HTTP/1.1 AuthZEN client (which offers
//! only `http/1.1`) is served too; tonic's own TLS offers only `h2`, and
//! rustls refuses a client whose offer does not meet it. Client
//! certificates are verified against the configured CA; the handshake's
//! certificates reach the admission layer as tonic's `TlsConnectInfo`.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;
use tokio_stream::{Stream, StreamExt as _};

use super::TlsPem;

/// Why the listener's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("{what}: {source}")]
    Pem {
        what: &'static str,
        source: rustls::pki_types::pem::Error,
    },
    #[error("client CA: {0}")]
    ClientCa(#[from] rustls::server::VerifierBuilderError),
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}

fn pem(what: &'static str) -> impl Fn(rustls::pki_types::pem::Error) -> TlsSetupError {
    move |source| TlsSetupError::Pem { what, source }
}

/// How long a client gets to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes finished and waiting for the server to take them.
const READY_QUEUE: usize = 64;

/// The acceptor of `pem`: its certificate chain and key, ALPN `h2` then
/// `http/1.1`, and, with a client CA, a client certificate required.
///
/// # Errors
/// [`TlsSetupError`] for unreadable PEM, a key that does not fit, or a
/// client CA that cannot verify.
pub(super) fn acceptor(files: &TlsPem) -> Result<TlsAcceptor, TlsSetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                roots.add(cert.map_err(pem("client CA"))?)?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let chain = CertificateDer::pem_slice_iter(&files.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem("certificate"))?;
    let key = PrivateKeyDer::from_pem_slice(&files.key).map_err(pem("key"))?;
    let mut config = builder.with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The TLS connections of `incoming`, each handshake on its own task (a
/// slow client holds up no other); a failed or slow handshake is dropped.
/// The returned task accepts until it is aborted.
pub(super) fn handshakes<I, IO>(
    mut incoming: I,
    acceptor: TlsAcceptor,
) -> (
    impl Stream<Item = std::io::Result<TlsStream<IO>>>,
    tokio::task::JoinHandle<()>,
)
where
    I: Stream<Item = std::io::Result<IO>> + Send + Unpin + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(READY_QUEUE);
    let task = tokio::spawn(async move {
        while let Some(conn) = incoming.next().await {
            let io = match conn {
                Ok(io) => io,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            });
        }
    });
    (tokio_stream::wrappers::ReceiverStream::new(rx), task)
}
