//! rustls configuration for both ends, read from PEM files, and the crypto
//! provider both ends use.
//!
//! tonic and arrow-flight are built with the `tls-aws-lc` feature only, so
//! the process has one crypto provider. It is installed as the process
//! default with AES-128-GCM first: tonic builds its configurations from the
//! default, and TLS 1.3 picks the first suite of the client's list that the
//! server supports.

use std::path::{Path, PathBuf};
use std::sync::Once;

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// PEM files of a sink that serves TLS; with `client_ca` it demands client
/// certificates signed by that CA (mutual TLS).
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// PEM files of a watcher that connects over TLS.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// The CA that signed the sink's certificate.
    pub ca: PathBuf,
    /// The watcher's own certificate and key, for mutual TLS.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name to check the sink's certificate against (default: the endpoint's host).
    pub domain: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot read {what} from {path}: {source}")]
pub struct TlsFileError {
    what: &'static str,
    path: PathBuf,
    source: std::io::Error,
}

fn read_pem(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|source| TlsFileError {
        what,
        path: path.to_owned(),
        source,
    })
}

/// Installs the process's crypto provider: aws-lc-rs with its TLS 1.3 AES-GCM
/// suites in the order AES-128, AES-256. AES-128-GCM runs 10 AES rounds
/// per block instead of 14 and is the suite every TLS 1.3 peer must
/// implement; the payload is bulk data, so its cost counts. A provider
/// installed earlier by the embedding program is kept.
pub fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        use rustls::crypto::aws_lc_rs::{cipher_suite, default_provider};
        let mut provider = default_provider();
        let preferred = [
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
        ];
        provider
            .cipher_suites
            .retain(|suite| !preferred.iter().any(|p| p.suite() == suite.suite()));
        provider.cipher_suites.splice(0..0, preferred);
        // Err means a provider is installed already: that one stays.
        let _ = provider.install_default();
    });
}

impl ServerTls {
    pub fn load(&self) -> Result<ServerTlsConfig, TlsFileError> {
        install_crypto_provider();
        let identity = Identity::from_pem(
            read_pem(&self.cert, "server certificate")?,
            read_pem(&self.key, "server private key")?,
        );
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(read_pem(
                ca,
                "client CA certificate",
            )?));
        }
        Ok(config)
    }
}

impl ClientTls {
    pub fn load(&self) -> Result<ClientTlsConfig, TlsFileError> {
        install_crypto_provider();
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read_pem(&self.ca, "CA certificate")?));
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            config = config.identity(Identity::from_pem(
                read_pem(cert, "client certificate")?,
                read_pem(key, "client private key")?,
            ));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        Ok(config)
    }
}

/// Files written by [`make_dev_certs`].
pub const DEV_CERT_FILES: [&str; 6] = [
    "ca.pem",
    "ca.key",
    "server.pem",
    "server.key",
    "client.pem",
    "client.key",
];

/// Writes a development CA and a server and a client certificate signed by
/// it into `dir`: enough to run a sink with mutual TLS. `hosts` become the
/// server certificate's subject alternative names.
pub fn make_dev_certs(
    dir: &Path,
    hosts: &[String],
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };

    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let write = |name: &str, content: String| {
        std::fs::write(dir.join(name), content)
            .map_err(|e| format!("cannot write {}: {e}", dir.join(name).display()))
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tailflight development CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    write("ca.pem", ca_cert.pem())?;
    write("ca.key", ca_key.serialize_pem())?;
    let issuer = Issuer::new(ca_params, ca_key);

    let leaf = |names: Vec<String>,
                common_name: &str,
                usage: ExtendedKeyUsagePurpose|
     -> Result<(String, String), rcgen::Error> {
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    let mut names = hosts.to_vec();
    if names.is_empty() {
        names = vec!["localhost".into(), "127.0.0.1".into()];
    }
    let (server_pem, server_key) = leaf(
        names,
        "tailflight sink",
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    write("server.pem", server_pem)?;
    write("server.key", server_key)?;
    let (client_pem, client_key) = leaf(
        vec!["tailflight-watcher".into()],
        "tailflight watcher",
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    write("client.pem", client_pem)?;
    write("client.key", client_key)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_installed_provider_prefers_aes_128_gcm() {
        install_crypto_provider();
        let provider = rustls::crypto::CryptoProvider::get_default().expect("installed");
        let suites: Vec<_> = provider.cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(
            suites[..2],
            [
                rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
                rustls::CipherSuite::TLS13_AES_256_GCM_SHA384
            ]
        );
        // Nothing was dropped on the way.
        let all = rustls::crypto::aws_lc_rs::default_provider().cipher_suites;
        assert_eq!(suites.len(), all.len());
    }
}
