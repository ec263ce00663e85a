//! rustls configuration for both ends, read from PEM files.
//!
//! tonic and arrow-flight are built with the `tls-ring` feature only, so the
//! process has exactly one crypto provider and needs no global install.

use std::path::{Path, PathBuf};

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

impl ServerTls {
    pub fn load(&self) -> Result<ServerTlsConfig, TlsFileError> {
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
