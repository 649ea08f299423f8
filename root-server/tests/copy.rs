//! A restarted root copies a live root of its shard (`yarl-root --copy-from`): real
//! processes on loopback ports, one SQLite database.

mod common;

use common::process::{write_token, Root};
use common::quota;
use serde_json::{json, Value};

const ADMIN: &str = "copy-admin-token";
const SYNC: &str = "copy-sync-token";

struct Roots {
    http: reqwest::Client,
}

impl Roots {
    async fn sync(&self, root: &Root, body: Value) -> Value {
        let r = self
            .http
            .post(format!("{}/v1/sync", root.url()))
            .bearer_auth(SYNC)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", root.log());
        r.json().await.unwrap()
    }

    async fn fill(&self, root: &Root, name: &str) -> f64 {
        let r = self
            .http
            .get(format!("{}/v1/quotas/{name}", root.url()))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        v["counter"]["fill"].as_f64().unwrap_or(0.0)
    }
}

/// Two limiters, `m1` and `m2`, count 10 units a round each. Root A takes every round; a
/// restarted root (B, with a copy of A; C, without) meets round 3 with the batches it never
/// acknowledged (2 and 3), what A acknowledged (`hinted_seq` 2) and each limiter's view
/// before the round as its hint. Hints merged by max lose the batch m1 added before m2's
/// older view lifted the counter past it; the copy holds every unit once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_started_from_a_copy_holds_every_unit_once() {
    let dir = tempfile::tempdir().unwrap();
    let admin = write_token(dir.path(), "admin", ADMIN);
    let sync = write_token(dir.path(), "sync", SYNC);
    let (admin, sync) = (admin.to_str().unwrap(), sync.to_str().unwrap());
    let tokens = ["--admin-token-file", admin, "--sync-token-file", sync];
    let a = Root::start(&[&tokens[..], &["--poll-interval", "100ms"]].concat());
    let db = format!("sqlite://{}", a.dir.path().join("yarl.db").display());
    let roots = Roots { http: reqwest::Client::new() };

    let r = roots
        .http
        .put(format!("{}/v1/quotas/ledger", a.url()))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body(quota(0.01, 10_000.0, 20_000.0, None))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = r.json::<Value>().await.unwrap()["id"].as_u64().unwrap();
    let batch = |seq: u64| json!({"seq": seq, "deltas": [[id, 10_000, 0]]});
    let round = |l: &str, seq: u64| json!({"v": 1, "limiter": l, "batches": [batch(seq)]});

    // Without the token the copy is refused: it names every limiter's whole id.
    let r = roots.http.get(format!("{}/v1/copy", a.url())).send().await.unwrap();
    assert_eq!(r.status(), 401);

    let mut views = Vec::new();
    for seq in 1..=2 {
        for l in ["m1", "m2"] {
            roots.sync(&a, round(l, seq)).await;
            if seq == 2 {
                views.push(roots.fill(&a, "ledger").await);
            }
        }
    }
    let b = Root::start(&[&tokens[..], &["--db", &db, "--copy-from", &a.url()]].concat());
    assert!(b.log().contains("counters and sessions copied"), "{}", b.log());
    let c = Root::start(&[&tokens[..], &["--db", &db]].concat());
    for (l, view) in ["m1", "m2"].into_iter().zip(views) {
        roots.sync(&a, round(l, 3)).await;
        let late = json!({
            "v": 1, "limiter": l, "batches": [batch(2), batch(3)],
            "root_instance": 12345, "hinted_seq": 2,
            "hints": [[id, (view * 1000.0) as u64]],
        });
        roots.sync(&b, late.clone()).await;
        roots.sync(&c, late).await;
    }
    let (at_a, at_b, at_c) = (
        roots.fill(&a, "ledger").await,
        roots.fill(&b, "ledger").await,
        roots.fill(&c, "ledger").await,
    );
    eprintln!("ledger: A {at_a}, B (copy) {at_b}, C (hints) {at_c}");
    assert!((59.0..=60.0).contains(&at_a), "{at_a}");
    assert!((at_a - at_b).abs() < 0.1, "A {at_a}, B {at_b}");
    assert!(at_a - at_c > 9.0, "A {at_a}, C {at_c}");
}

/// A peer that is down, or answers with the wrong token, leaves the root to start without
/// a copy, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_starts_without_a_copy_when_no_peer_gives_one() {
    let dir = tempfile::tempdir().unwrap();
    let admin = write_token(dir.path(), "admin", ADMIN);
    let other = write_token(dir.path(), "other", "another-admin-token");
    let a = Root::start(&["--admin-token-file", admin.to_str().unwrap()]);
    let down = format!("http://127.0.0.1:{}", common::process::free_port());
    let peers = format!("{down},{}", a.url());
    let b = Root::start(&["--admin-token-file", other.to_str().unwrap(), "--copy-from", &peers]);
    let log = b.log();
    assert!(log.contains(&format!("no copy from {down}")), "{log}");
    assert!(log.contains("401"), "{log}");
    assert!(log.contains("counters come back from the limiters' hints"), "{log}");
}

/// A peer that lies (a body past the cap, or not a copy) is refused, and the root starts
/// without a copy: it never reads more than the cap.
#[test]
fn a_lying_peer_is_refused_and_the_root_starts_without_a_copy() {
    use std::io::{Read as _, Write as _};
    for answer in [
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4000000000\r\n\r\n{",
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\nnot json!",
    ] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(answer.as_bytes());
        });
        let b = Root::start(&["--copy-from", &peer]);
        server.join().unwrap();
        let log = b.log();
        assert!(log.contains(&format!("no copy from {peer}")), "{log}");
        assert!(log.contains("a copy of more than") || log.contains("the copy:"), "{log}");
        assert!(log.contains("counters come back from the limiters' hints"), "{log}");
    }
}
