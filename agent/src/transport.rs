//! How a sync request reaches a root: the [`Transport`] trait and its HTTP(S) implementation.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use yarl_core::proto::{SyncRequest, SyncResponse};

/// Boxed future of one sync call.
pub type CallFuture = Pin<Box<dyn Future<Output = Result<SyncResponse, String>> + Send>>;

/// How a sync request reaches a root.
pub trait Transport: Send + Sync + 'static {
    /// Sends `req` to the root at `url`; resolves within `timeout` or fails with a short
    /// description (shown in stats pages).
    fn call(&self, url: &str, req: SyncRequest, timeout: Duration) -> CallFuture;
}

/// Settings of [`HttpTransport`].
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// PEM file of the certificates that verify `https://` roots, instead of the system's
    /// trust store (nginx: `yarl_sync_ca`).
    pub ca_file: Option<PathBuf>,
}

/// Why a transport could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The CA file cannot be read.
    #[error("cannot read the CA file {path}: {source}")]
    CaRead {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The CA file holds no certificate, or a broken one.
    #[error("the CA file {path} {why}")]
    CaInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Client(String),
}

/// Reads the PEM certificates of `path` (at least one).
pub fn load_ca(path: &Path) -> Result<Vec<reqwest::Certificate>, TransportError> {
    let pem = std::fs::read(path)
        .map_err(|source| TransportError::CaRead { path: path.to_owned(), source })?;
    let invalid = |why: String| TransportError::CaInvalid { path: path.to_owned(), why };
    if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
        return Err(invalid("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into()));
    }
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| invalid(format!("is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid("holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// JSON over HTTP or HTTPS: `POST {url}/v1/sync`, optional bearer token.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
    token: Option<Arc<str>>,
}

impl HttpTransport {
    /// A transport with these options. TLS is rustls, verifying roots against the system's
    /// trust store or the CA file.
    pub fn new(opts: &HttpOptions) -> Result<Self, TransportError> {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true);
        if let Some(path) = &opts.ca_file {
            b = b.tls_built_in_root_certs(false);
            for c in load_ca(path)? {
                b = b.add_root_certificate(c);
            }
        }
        let client = b.build().map_err(|e| TransportError::Client(describe(&e)))?;
        Ok(HttpTransport { client, token: opts.token.as_deref().map(Into::into) })
    }
}

impl Transport for HttpTransport {
    fn call(&self, url: &str, req: SyncRequest, timeout: Duration) -> CallFuture {
        let endpoint = format!("{}/v1/sync", url.trim_end_matches('/'));
        let mut rb = self.client.post(endpoint).timeout(timeout).json(&req);
        if let Some(t) = &self.token {
            rb = rb.bearer_auth(t);
        }
        Box::pin(async move {
            let resp = rb.send().await.map_err(|e| describe(&e))?;
            let status = resp.status();
            if !status.is_success() {
                let body = resp.text().await.unwrap_or_default();
                let body: String = body.chars().take(200).collect();
                return Err(format!("HTTP {}: {}", status.as_u16(), body.trim()));
            }
            let body = resp.bytes().await.map_err(|e| describe(&e))?;
            serde_json::from_slice::<SyncResponse>(&body).map_err(|e| format!("bad answer: {e}"))
        })
    }
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".into();
    }
    let mut s = if e.is_connect() { "connection failed".to_string() } else { e.to_string() };
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        let text = inner.to_string();
        // Certificate problems are what an operator needs to see; plain refusals are not.
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("yarl-agent-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        assert!(matches!(load_ca(&missing), Err(TransportError::CaRead { .. })));
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = load_ca(&empty).unwrap_err().to_string();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        let broken = dir.join("broken.pem");
        std::fs::write(&broken, "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n")
            .unwrap();
        assert!(load_ca(&broken).is_err());
        let opts = HttpOptions { token: None, ca_file: Some(broken) };
        assert!(HttpTransport::new(&opts).is_err());
        assert!(HttpTransport::new(&HttpOptions::default()).is_ok());
        std::fs::remove_dir_all(&dir).ok();
    }
}
