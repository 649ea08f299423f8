//! HTTPS for both APIs: a rustls configuration read from PEM files and swapped in place when
//! the files change (checked every few seconds) or on `SIGHUP`, so a renewed certificate
//! takes effect without a restart and without dropping connections. A reload that fails
//! (half-written file, key not matching) keeps the configuration in use and says why.

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Why the certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The certificate file could not be read or holds no certificate.
    #[error("certificate file {path}: {message}")]
    Cert {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The key file could not be read or holds no private key.
    #[error("key file {path}: {message}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refused the pair (e.g. the key does not match the certificate).
    #[error("certificate {cert} with key {key}: {message}")]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        message: String,
    },
}

/// What identifies a version of a file without reading it.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(p: &Path) -> Stamp {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// The certificate and key files and the configuration made from them.
#[derive(Debug)]
pub struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    current: ArcSwap<ServerConfig>,
    stamps: Mutex<(Stamp, Stamp)>,
}

impl TlsFiles {
    /// Reads both files; fails if either is unusable.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let stamps = (stamp(cert), stamp(key));
        let config = build(cert, key)?;
        Ok(TlsFiles {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: ArcSwap::from_pointee(config),
            stamps: Mutex::new(stamps),
        })
    }

    /// The configuration for the next handshake.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    /// Re-reads the files; `Ok(true)` if a new configuration is in use.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let stamps = (stamp(&self.cert), stamp(&self.key));
        let config = build(&self.cert, &self.key)?;
        self.current.store(Arc::new(config));
        *self.stamps.lock() = stamps;
        Ok(true)
    }

    /// Re-reads the files if either changed since the last (re)load.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = (stamp(&self.cert), stamp(&self.key));
        if *self.stamps.lock() == now {
            return Ok(false);
        }
        let result = self.reload();
        if result.is_err() {
            // Say it once per change of the files, not every few seconds.
            *self.stamps.lock() = now;
        }
        result
    }
}

fn build(cert: &Path, key: &Path) -> Result<ServerConfig, TlsError> {
    let cert_err = |message: String| TlsError::Cert { path: cert.to_owned(), message };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(cert_err("no PEM certificate in it".into()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError::Key { path: key.to_owned(), message: e.to_string() })?;
    // The provider is named rather than taken from the process default: other crates in
    // the build may enable a second one, and then the default is ambiguous.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config_err = |e: rustls::Error| TlsError::Config {
        cert: cert.to_owned(),
        key: key.to_owned(),
        message: e.to_string(),
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(config_err)?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(config_err)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
