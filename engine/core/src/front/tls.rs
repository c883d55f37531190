//! TLS on the router's public port: the same certificate and key settings as the Python
//! servers (`QSTATE_TLS_CERT`, `QSTATE_TLS_KEY`; `qstate certs` makes them), with rustls.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

fn bad(what: &str, path: &Path, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("{what} {}: {e}", path.display()))
}

pub fn acceptor(cert: &Path, key: &Path) -> io::Result<TlsAcceptor> {
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut io::BufReader::new(
        std::fs::File::open(cert).map_err(|e| bad("TLS certificate", cert, e))?,
    ))
    .collect::<Result<_, _>>()
    .map_err(|e| bad("TLS certificate", cert, e))?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut io::BufReader::new(
        std::fs::File::open(key).map_err(|e| bad("TLS key", key, e))?,
    ))
    .map_err(|e| bad("TLS key", key, e))?
    .ok_or_else(|| bad("TLS key", key, "no private key in it"))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| io::Error::other(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad("TLS certificate", cert, e))?;
    let mut config = config;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
