//! Helpers shared by the integration tests: fresh databases, a request helper, servers on
//! loopback ports.
#![allow(dead_code)]

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;
use yarl_root::db::{self, QuotaStore};
use yarl_root::{app, AppState, Settings};

/// A fresh SQLite database in a temporary directory (kept alive by the returned guard).
pub async fn sqlite_store() -> (Arc<dyn QuotaStore>, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("yarl.db").display());
    (db::open(&url).await.unwrap(), url, dir)
}

/// The PostgreSQL server given by `YARL_TEST_PG_URL`, or `None` with a note on stderr.
/// When `YARL_TEST_PG_REQUIRED=1` (set by `make test` and CI), a missing URL fails the
/// test instead: a suite that cannot reach PostgreSQL must not pass as if it had.
pub fn pg_url(test: &str) -> Option<String> {
    match std::env::var("YARL_TEST_PG_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if pg_required() => panic!(
            "{test}: YARL_TEST_PG_URL is not set but YARL_TEST_PG_REQUIRED=1: run the tests \
             under scripts/with-postgres.sh (make test does)"
        ),
        _ => {
            eprintln!(
                "{test}: skipped: YARL_TEST_PG_URL not set (run under scripts/with-postgres.sh)"
            );
            None
        }
    }
}

/// Whether PostgreSQL tests must run rather than skip.
pub fn pg_required() -> bool {
    std::env::var("YARL_TEST_PG_REQUIRED").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

/// A new, empty database on the server at `base` (a URL naming any database); returns its
/// URL. Every test gets its own, so tests run in parallel and reruns start clean.
pub async fn fresh_pg_db(base: &str) -> String {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(base).await.unwrap();
    let name = format!("yarl_t_{:016x}", rand_u64());
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.unwrap();
    let (head, tail) = base.rsplit_once('/').unwrap();
    let query = tail.find('?').map(|i| &tail[i..]).unwrap_or("");
    format!("{head}/{name}{query}")
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos(),
    );
    h.finish()
}

/// A root over `store`, loaded.
pub async fn state(store: Arc<dyn QuotaStore>, settings: Settings) -> AppState {
    let st = AppState::new(store, settings);
    st.load().await.unwrap();
    st
}

/// Sends one request through the router; returns the status and the JSON body (or the
/// body as a JSON string when it is not JSON).
pub async fn call(
    st: &AppState,
    method: Method,
    uri: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req.body(body.map(|b| Body::from(b.to_owned())).unwrap_or_else(Body::empty)).unwrap();
    let resp = app(st.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, v)
}

/// The `error` message of a JSON error body.
pub fn err(v: &Value) -> &str {
    v["error"].as_str().unwrap_or_else(|| panic!("no error message in {v}"))
}

/// Serves `st` on a free loopback port; returns the base URL. The server stops with the
/// test's runtime.
pub async fn serve(st: AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app(st)).await.unwrap();
    });
    format!("http://{addr}")
}

pub fn quota(limit: f64, low: f64, high: f64, parent: Option<&str>) -> String {
    serde_json::json!({"limit": limit, "low_burst": low, "high_burst": high, "parent": parent})
        .to_string()
}

pub fn short_poll() -> Settings {
    Settings { poll_interval: Duration::from_millis(200), ..Settings::default() }
}
pub mod process;
