//! copy_floor's TLS: TLS 1.3 with the one cipher suite
//! TLS13_AES_128_GCM_SHA256 through tokio-rustls, as tonic uses it; a
//! self-signed certificate for "localhost" that the receiver makes at start
//! and the sender trusts alone.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::crypto::CryptoProvider;
use rustls::crypto::aws_lc_rs::{cipher_suite, default_provider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::{TlsAcceptor, TlsConnector};

const CERT_FILE: &str = "cert.pem";

/// aws-lc-rs with TLS13_AES_128_GCM_SHA256 as its only cipher suite.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        cipher_suites: vec![cipher_suite::TLS13_AES_128_GCM_SHA256],
        ..default_provider()
    })
}

/// Makes the self-signed certificate, writes `cert.pem` into `dir` (whole,
/// by a rename) and returns the acceptor that serves it.
pub fn acceptor(dir: &Path) -> Result<TlsAcceptor> {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .context("cannot make a self-signed certificate")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let temp = dir.join(format!("{CERT_FILE}.{}.tmp", std::process::id()));
    std::fs::write(&temp, certified.cert.pem())
        .with_context(|| format!("cannot write {}", temp.display()))?;
    let path = dir.join(CERT_FILE);
    std::fs::rename(&temp, &path)
        .with_context(|| format!("cannot rename {} to {}", temp.display(), path.display()))?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 with AES-128-GCM")?
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .context("the self-signed certificate")?;
    // No session resumption here: no tickets to send.
    config.send_tls13_tickets = 0;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Trusts exactly the certificate the receiver wrote into `dir`.
pub fn connector(dir: &Path) -> Result<TlsConnector> {
    let path = dir.join(CERT_FILE);
    let pem = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let cert = CertificateDer::from_pem_slice(&pem)
        .with_context(|| format!("no certificate in {}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(cert)
        .with_context(|| format!("the certificate in {}", path.display()))?;
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3 with AES-128-GCM")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}
