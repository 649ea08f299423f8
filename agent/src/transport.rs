//! How a sync request reaches a root: the [`Transport`] trait and its HTTP(S) implementation.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use yarl_core::proto::{v2, SyncRequest, SyncResponse};

/// Boxed future of one sync call.
pub type CallFuture = Pin<Box<dyn Future<Output = Result<SyncResponse, String>> + Send>>;

/// How a sync request reaches a root.
pub trait Transport: Send + Sync + 'static {
    /// Sends `req` to the root at `url`; resolves within `timeout` or fails with a short
    /// description (shown in stats pages).
    fn call(&self, url: &str, req: SyncRequest, timeout: Duration) -> CallFuture;
}

/// Which encoding of the sync messages a transport sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Protocol {
    /// Protocol v2 (binary, `application/x-yarl-sync+v2`); a root that answers `415`
    /// (older than v2) gets v1 instead, and v2 again after [`V2_RETRY`].
    #[default]
    V2,
    /// Protocol v1 only (JSON, `application/json`): for debugging with a proxy.
    V1,
}

/// How long a root that refused v2 gets v1 before v2 is tried again (it may have been
/// upgraded).
pub const V2_RETRY: Duration = Duration::from_secs(600);

/// Largest answer body accepted, bytes: a first contact with a million quotas arrives in
/// pages of 10,000, and a million changed counters take about 6 MB in v2 and 25 MB in v1.
pub const MAX_ANSWER_BYTES: usize = 256 << 20;

/// Largest v1 (JSON) answer body accepted, bytes: v1 is the debugging encoding, and its
/// entries are only bounded by the body (about 8 bytes each, 24 once decoded).
pub const MAX_V1_ANSWER_BYTES: usize = 64 << 20;

/// Most counters plus quotas one v2 answer may declare.
const MAX_ANSWER_ENTRIES: usize = 50_000_000;

/// Most of an answer's declared length reserved before its bytes arrive: a root that
/// declares 256 MiB and sends nothing must not cost 256 MiB.
const ANSWER_RESERVE: usize = 1 << 20;

/// Shortest wait for a connection before a fresh attempt (see [`ConnectPace`]).
const RECONNECT_MIN: Duration = Duration::from_millis(50);

/// A connection attempt waits this many times the slowest recent connect before a fresh
/// one starts over.
const RECONNECT_FACTOR: u64 = 4;

/// How long a connection attempt to a plain-HTTP root may take before it is given up for
/// a fresh one.
///
/// A SYN lost to a partition, a dropped packet or a full accept queue is sent again by the
/// kernel only a second later (then 3, 7 s), longer than a call's timeout: a call begun
/// just before a partition healed waited out its timeout, and the limiter's counts reached
/// the roots up to an interval after the heal. Starting over after a few times the slowest
/// connect seen lately sends a fresh SYN instead. Each further attempt of a call waits
/// twice as long as the one before, and the last one that fits in the call waits for all
/// that is left (see [`attempt_wait`]): a connect that is slow for once still gets through
/// if it takes up to about two thirds of the call. Only `http://` roots: what is timed is
/// the name lookup and the TCP connect, which the root's kernel answers whatever the
/// root's load, so an attempt given up costs the root nothing. An `https://` root's
/// connect includes the TLS handshake, the root's own work: giving one up on a loaded root
/// (a restart, every limiter reconnecting at once) would multiply that work, so those wait
/// as before. Until one connect has been measured there is no limit; the measure is shared
/// by the transport's roots, so the slowest makes every attempt patient.
#[derive(Debug, Clone, Default)]
struct ConnectPace {
    /// Slowest recent connect, ns, decaying by a quarter per newer one; 0: none yet.
    slowest_ns: Arc<AtomicU64>,
    /// Attempts given up, for tests.
    #[cfg(test)]
    given_up: Arc<AtomicU64>,
}

tokio::task_local! {
    /// How long the current call's connection attempt may take (see [`ConnectPace`]);
    /// `None`: as long as the call.
    static ATTEMPT_WAIT: Option<Duration>;
}

impl ConnectPace {
    /// The first attempt's wait, once a connect has been measured.
    fn patience(&self) -> Option<Duration> {
        match self.slowest_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => {
                Some(RECONNECT_MIN.max(Duration::from_nanos(ns.saturating_mul(RECONNECT_FACTOR))))
            }
        }
    }

    fn record(&self, took: Duration) {
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
        let _ = self.slowest_ns.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            Some(took.max(old - old / 4))
        });
    }
}

/// Whether connection attempts to `endpoint` may start over (plain HTTP, see
/// [`ConnectPace`]).
fn starts_over(endpoint: &str) -> bool {
    endpoint.get(..7).is_some_and(|p| p.eq_ignore_ascii_case("http://"))
}

/// The wait of a call's attempt after `given_up` attempts, `left` before its deadline:
/// twice the one before; none (all that is left) once two such waits no longer fit.
fn attempt_wait(first: Option<Duration>, given_up: u32, left: Duration) -> Option<Duration> {
    let wait = first?.saturating_mul(1 << given_up.min(16));
    (left >= wait.saturating_mul(2)).then_some(wait)
}

/// A connection attempt given up for a fresh one (see [`ConnectPace`]); nothing was sent.
#[derive(Debug, thiserror::Error)]
#[error("no connection within {0:?}")]
struct ConnectStalled(Duration);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The connector layer that applies [`ConnectPace`].
#[derive(Debug, Clone)]
struct PacedConnectLayer(ConnectPace);

impl<S> tower_layer::Layer<S> for PacedConnectLayer {
    type Service = PacedConnect<S>;

    fn layer(&self, inner: S) -> PacedConnect<S> {
        PacedConnect { inner, pace: self.0.clone() }
    }
}

#[derive(Debug, Clone)]
struct PacedConnect<S> {
    inner: S,
    pace: ConnectPace,
}

impl<S, R> tower_service::Service<R> for PacedConnect<S>
where
    S: tower_service::Service<R>,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: R) -> Self::Future {
        // Read when the connect is asked for, in the call's task (hyper polls the connect
        // there first); elsewhere (a connect hyper finishes in the background), no limit.
        let patience = ATTEMPT_WAIT.try_with(|w| *w).unwrap_or(None);
        let connect = self.inner.call(req);
        let pace = self.pace.clone();
        Box::pin(async move {
            let start = Instant::now();
            let r = match patience {
                None => connect.await,
                Some(p) => match tokio::time::timeout(p, connect).await {
                    Ok(r) => r,
                    Err(_) => {
                        #[cfg(test)]
                        pace.given_up.fetch_add(1, Ordering::Relaxed);
                        return Err(Box::new(ConnectStalled(p)) as BoxError);
                    }
                },
            };
            if r.is_ok() {
                pace.record(start.elapsed());
            }
            r.map_err(Into::into)
        })
    }
}

/// Whether `e` is a connection attempt given up by [`PacedConnect`].
fn stalled(e: &reqwest::Error) -> bool {
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        if inner.is::<ConnectStalled>() {
            return true;
        }
        src = inner.source();
    }
    false
}

/// Settings of [`HttpTransport`].
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// PEM file of the certificates that verify `https://` roots, instead of the system's
    /// trust store (nginx: `yarl_sync_ca`).
    pub ca_file: Option<PathBuf>,
    /// The encoding to send (v2 by default, with the fallback to v1).
    pub protocol: Protocol,
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

/// Protocol v2 (or v1 JSON) over HTTP or HTTPS: `POST {url}/v1/sync`, optional bearer
/// token.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
    token: Option<Arc<str>>,
    protocol: Protocol,
    /// Roots that refused v2 with `415`, and when.
    v1_only: Arc<Mutex<HashMap<String, Instant>>>,
    /// The connector's measure of connects.
    pace: ConnectPace,
}

impl HttpTransport {
    /// A transport with these options. TLS is rustls, verifying roots against the system's
    /// trust store or the CA file.
    pub fn new(opts: &HttpOptions) -> Result<Self, TransportError> {
        let pace = ConnectPace::default();
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .connector_layer(PacedConnectLayer(pace.clone()))
            // A root never redirects: following one would send the token where the answer
            // said (reqwest keeps `Authorization` when only the scheme changes).
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true);
        if let Some(path) = &opts.ca_file {
            b = b.tls_built_in_root_certs(false);
            for c in load_ca(path)? {
                b = b.add_root_certificate(c);
            }
        }
        let client = b.build().map_err(|e| TransportError::Client(describe(&e)))?;
        Ok(HttpTransport {
            client,
            token: opts.token.as_deref().map(Into::into),
            protocol: opts.protocol,
            v1_only: Arc::default(),
            pace,
        })
    }

    /// Whether `url` gets v2 now.
    fn speaks_v2(&self, url: &str) -> bool {
        if self.protocol == Protocol::V1 {
            return false;
        }
        let mut v1 = self.v1_only.lock();
        match v1.get(url) {
            Some(at) if at.elapsed() < V2_RETRY => false,
            Some(_) => {
                v1.remove(url);
                true
            }
            None => true,
        }
    }
}

/// Whether a content type names protocol v2.
fn is_v2(content_type: Option<&str>) -> bool {
    let essence = content_type.unwrap_or("").split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case(v2::CONTENT_TYPE)
}

/// Reads an answer body of at most `max` bytes.
async fn read_answer(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(format!("answer larger than {max} bytes"));
    }
    let declared = resp.content_length().unwrap_or(0) as usize;
    let mut body = Vec::with_capacity(declared.min(ANSWER_RESERVE));
    while let Some(chunk) = resp.chunk().await.map_err(|e| describe(&e))? {
        if body.len() + chunk.len() > max {
            return Err(format!("answer larger than {max} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The start of an error answer's body, for the error message: at most
/// [`ERROR_BODY_BYTES`] read, the rest left unread (the connection is dropped with the
/// response). Read whole, a root (or what answers in its place) streaming an error body
/// filled the agent's worker with it until the call's timeout.
async fn error_text(mut resp: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < ERROR_BODY_BYTES {
        match resp.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(ERROR_BODY_BYTES);
    String::from_utf8_lossy(&body).chars().take(200).collect()
}

/// Bytes of an error answer read for its message.
const ERROR_BODY_BYTES: usize = 1024;

/// Decodes an answer in the encoding its content type names.
fn decode_answer(content_type: Option<&str>, body: &[u8]) -> Result<SyncResponse, String> {
    if is_v2(content_type) {
        v2::decode_response(body, MAX_ANSWER_ENTRIES).map_err(|e| format!("bad answer: {e}"))
    } else {
        serde_json::from_slice::<SyncResponse>(body).map_err(|e| format!("bad answer: {e}"))
    }
}

impl Transport for HttpTransport {
    fn call(&self, url: &str, req: SyncRequest, timeout: Duration) -> CallFuture {
        let endpoint = format!("{}/v1/sync", url.trim_end_matches('/'));
        let this = self.clone();
        let url = url.to_owned();
        let deadline = Instant::now() + timeout;
        Box::pin(async move {
            let mut v2 = this.speaks_v2(&url);
            let may_start_over = starts_over(&endpoint);
            let mut given_up = 0;
            loop {
                let (ct, body) = if v2 {
                    (v2::CONTENT_TYPE, v2::encode_request(&req))
                } else {
                    ("application/json", serde_json::to_vec(&req).map_err(|e| e.to_string())?)
                };
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err("timed out".into());
                }
                let mut rb = this
                    .client
                    .post(&endpoint)
                    .timeout(left)
                    .header(reqwest::header::CONTENT_TYPE, ct)
                    .body(body);
                if let Some(t) = &this.token {
                    rb = rb.bearer_auth(t);
                }
                let wait = may_start_over
                    .then(|| attempt_wait(this.pace.patience(), given_up, left))
                    .flatten();
                let resp = match ATTEMPT_WAIT.scope(wait, rb.send()).await {
                    Ok(resp) => resp,
                    // Nothing was sent: a fresh connection, with what is left of the time.
                    Err(e) if stalled(&e) => {
                        given_up += 1;
                        continue;
                    }
                    Err(e) => return Err(describe(&e)),
                };
                let status = resp.status();
                if status == reqwest::StatusCode::UNSUPPORTED_MEDIA_TYPE && v2 {
                    // A root older than protocol v2: JSON from now on (for a while).
                    this.v1_only.lock().insert(url.clone(), Instant::now());
                    v2 = false;
                    continue;
                }
                if !status.is_success() {
                    let body = error_text(resp).await;
                    return Err(format!("HTTP {}: {}", status.as_u16(), body.trim()));
                }
                let ct = resp
                    .headers()
                    .get(reqwest::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let max = if is_v2(ct.as_deref()) { MAX_ANSWER_BYTES } else { MAX_V1_ANSWER_BYTES };
                let body = read_answer(resp, max).await?;
                return decode_answer(ct.as_deref(), &body);
            }
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
        let opts = HttpOptions { ca_file: Some(broken), ..HttpOptions::default() };
        assert!(HttpTransport::new(&opts).is_err());
        assert!(HttpTransport::new(&HttpOptions::default()).is_ok());
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A fake root on loopback: each whole request (head and body, lowercased) goes to
    /// `answer`, whose text is written back as the response.
    async fn fake_root(answer: impl Fn(&str) -> String + Send + Sync + 'static) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let answer = Arc::new(answer);
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let n = sock.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).to_lowercase();
                        let Some(end) = text.find("\r\n\r\n") else { continue };
                        let len: usize = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if buf.len() < end + 4 + len {
                            continue;
                        }
                        let resp = answer(&text);
                        if sock.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                        buf.drain(..end + 4 + len);
                    }
                });
            }
        });
        url
    }

    fn response(status: &str, headers: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    fn request() -> SyncRequest {
        SyncRequest {
            v: 1,
            limiter: "l".into(),
            root_instance: None,
            since: 0,
            epoch: 0,
            batches: vec![],
            hints: vec![],
            seen_epoch: None,
            interest: false,
            watch: Vec::new(),
            key_templates: Vec::new(),
            hinted_seq: None,
            in_flight: Vec::new(),
            view_age_ns: None,
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    const ANSWER: &str = r#"{"v":1,"root_instance":7,"acked_seq":0,"version":3,"epoch":0}"#;

    /// A root older than protocol v2 answers `415` to binary bodies: the transport resends
    /// the same request as JSON, and keeps sending JSON to that root.
    #[test]
    fn falls_back_to_json_on_415() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        runtime().block_on(async {
            let binary = Arc::new(AtomicUsize::new(0));
            let seen = binary.clone();
            let url = fake_root(move |text| {
                if text.contains(v2::CONTENT_TYPE) {
                    seen.fetch_add(1, Ordering::Relaxed);
                    response("415 Unsupported Media Type", "", r#"{"error":"no"}"#)
                } else {
                    response("200 OK", "", ANSWER)
                }
            })
            .await;
            let t = HttpTransport::new(&HttpOptions::default()).unwrap();
            for _ in 0..3 {
                let r = t.call(&url, request(), Duration::from_secs(5)).await.unwrap();
                assert_eq!((r.root_instance, r.version), (7, 3));
            }
            assert_eq!(binary.load(Ordering::Relaxed), 1, "v2 tried once, then JSON");
        });
    }

    /// A redirect is an error, never followed: the token would go where the answer said.
    #[test]
    fn redirects_are_not_followed() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        runtime().block_on(async {
            let reached = Arc::new(AtomicUsize::new(0));
            let r2 = reached.clone();
            let elsewhere = fake_root(move |_| {
                r2.fetch_add(1, Ordering::Relaxed);
                response("200 OK", "", ANSWER)
            })
            .await;
            let location = format!("location: {elsewhere}/v1/sync\r\n");
            let url = fake_root(move |_| response("307 Temporary Redirect", &location, "")).await;
            let opts = HttpOptions { token: Some("secret".into()), ..HttpOptions::default() };
            let t = HttpTransport::new(&opts).unwrap();
            let e = t.call(&url, request(), Duration::from_secs(5)).await.unwrap_err();
            assert!(e.starts_with("HTTP 307"), "{e}");
            assert_eq!(reached.load(Ordering::Relaxed), 0, "the redirect was followed");
        });
    }

    /// An error answer's body is read for its first bytes only: one that streams on (here
    /// 16 MiB of a declared GiB) was read whole, into the agent's worker, until the timeout.
    #[test]
    fn an_error_answer_is_read_for_its_first_bytes_only() {
        runtime().block_on(async {
            let url = fake_root(move |_| {
                let body = "x".repeat(16 << 20);
                format!("HTTP/1.1 500 Oops\r\ncontent-length: {}\r\n\r\n{body}", 1u64 << 30)
            })
            .await;
            let t = HttpTransport::new(&HttpOptions::default()).unwrap();
            let started = Instant::now();
            let e = t.call(&url, request(), Duration::from_secs(3)).await.unwrap_err();
            assert!(e.starts_with("HTTP 500: xxx") && e.len() < 300, "{}", &e[..e.len().min(80)]);
            assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        });
    }

    /// A root whose accept queue is full drops SYNs, as a partition does; the kernel sends
    /// one again only a second later. Once a connect has been measured, a stalled attempt
    /// starts over with a fresh SYN, so the call gets through soon after the root accepts
    /// again; before, it waits for the kernel's second SYN.
    #[test]
    fn a_stalled_connect_starts_over() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for measured in [true, false] {
            let took = runtime().block_on(async {
                let sock = tokio::net::TcpSocket::new_v4().unwrap();
                sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
                let listener = sock.listen(1).unwrap();
                let addr = listener.local_addr().unwrap();
                // Fill the accept queue: connects that are never accepted until `opens`.
                let mut fill = Vec::new();
                for _ in 0..4 {
                    let c = tokio::net::TcpStream::connect(addr);
                    if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_millis(100), c).await {
                        fill.push(c);
                    }
                }
                assert!(!fill.is_empty() && fill.len() < 4, "{} queued", fill.len());
                let opens = Duration::from_millis(300);
                tokio::spawn(async move {
                    tokio::time::sleep(opens).await;
                    loop {
                        let (mut s, _) = listener.accept().await.unwrap();
                        tokio::spawn(async move {
                            let mut buf = [0u8; 4096];
                            let mut seen = Vec::new();
                            while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
                                match s.read(&mut buf).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                                }
                            }
                            let _ = s.write_all(response("200 OK", "", ANSWER).as_bytes()).await;
                        });
                    }
                });
                let t = HttpTransport::new(&HttpOptions {
                    protocol: Protocol::V1,
                    ..HttpOptions::default()
                })
                .unwrap();
                if measured {
                    t.pace.record(Duration::from_millis(1));
                }
                let start = Instant::now();
                let url = format!("http://{addr}");
                let r = t.call(&url, request(), Duration::from_secs(5)).await.unwrap();
                assert_eq!(r.root_instance, 7);
                drop(fill);
                let given_up = t.pace.given_up.load(std::sync::atomic::Ordering::Relaxed);
                if measured {
                    // 50 + 100 ms given up, the third attempt's SYN (at 150 ms) lost too.
                    assert_eq!(given_up, 3, "attempts given up before the last");
                }
                start.elapsed()
            });
            if measured {
                assert!(took < Duration::from_millis(700), "started over: {took:?}");
            } else {
                assert!(took >= Duration::from_millis(900), "the kernel's retry: {took:?}");
            }
        }
    }

    /// A connect slower than the measure is still reached when it takes up to two thirds
    /// of the call: each attempt waits twice as long as the one before, and the last that
    /// fits all that is left. Only plain-HTTP roots start over.
    #[test]
    fn a_slow_connect_is_reached() {
        use tower_layer::Layer;
        use tower_service::Service;
        #[derive(Clone)]
        struct Slow(Duration);
        impl Service<()> for Slow {
            type Response = ();
            type Error = std::io::Error;
            type Future = Pin<Box<dyn Future<Output = Result<(), std::io::Error>> + Send>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: ()) -> Self::Future {
                let took = self.0;
                Box::pin(async move {
                    tokio::time::sleep(took).await;
                    Ok(())
                })
            }
        }
        let ms = Duration::from_millis;
        assert!(starts_over("http://r:1/v1/sync") && starts_over("HTTP://r:1/v1/sync"));
        assert!(!starts_over("https://r:1/v1/sync"));
        assert_eq!(attempt_wait(None, 0, ms(500)), None, "nothing measured: no limit");
        assert_eq!(attempt_wait(Some(ms(50)), 0, ms(500)), Some(ms(50)));
        assert_eq!(attempt_wait(Some(ms(50)), 1, ms(450)), Some(ms(100)));
        assert_eq!(attempt_wait(Some(ms(50)), 2, ms(350)), None, "the last: all that is left");
        runtime().block_on(async {
            let pace = ConnectPace::default();
            assert_eq!(pace.patience(), None);
            pace.record(ms(1));
            assert_eq!(pace.patience(), Some(RECONNECT_MIN));
            let mut svc = PacedConnectLayer(pace.clone()).layer(Slow(ms(300)));
            let deadline = Instant::now() + ms(500);
            let mut given_up = 0;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let wait = attempt_wait(pace.patience(), given_up, left);
                match ATTEMPT_WAIT.scope(wait, async { svc.call(()).await }).await {
                    Ok(()) => break,
                    Err(e) => assert!(e.is::<ConnectStalled>(), "{e}"),
                }
                given_up += 1;
                assert!(given_up < 10, "never reached");
            }
            assert!(Instant::now() <= deadline, "within the call");
            assert_eq!(given_up, 2, "50 and 100 ms given up, the rest enough");
            assert!(pace.patience().unwrap() >= ms(1200), "the slow one is the measure now");
        });
    }

    /// A JSON answer may not declare more than [`MAX_V1_ANSWER_BYTES`].
    #[test]
    fn a_json_answer_is_bounded() {
        runtime().block_on(async {
            let big = MAX_V1_ANSWER_BYTES + 1;
            let url = fake_root(move |_| {
                format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {big}\r\n\r\n[")
            })
            .await;
            let t = HttpTransport::new(&HttpOptions { protocol: Protocol::V1, ..Default::default() })
                .unwrap();
            let e = t.call(&url, request(), Duration::from_secs(5)).await.unwrap_err();
            assert_eq!(e, format!("answer larger than {MAX_V1_ANSWER_BYTES} bytes"));
        });
    }
}
