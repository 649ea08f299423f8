//! Roots on loopback ports: two roots sharing one PostgreSQL, and a root whose database
//! becomes unavailable under running syncs.

mod common;

use common::{fresh_pg_db, pg_url, quota, serve, short_poll, state};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use yarl_root::db;

async fn sync(client: &reqwest::Client, base: &str, limiter: &str, epoch: u64) -> (u16, Value) {
    let body = json!({"v": 1, "limiter": limiter, "epoch": epoch});
    let r = client.post(format!("{base}/v1/sync")).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn put(client: &reqwest::Client, base: &str, name: &str, body: String) -> (u16, Value) {
    let r = client
        .put(format!("{base}/v1/quotas/{name}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_through_one_root_reaches_limiters_of_another() {
    let Some(base) = pg_url("write_through_one_root_reaches_limiters_of_another") else { return };
    let url = fresh_pg_db(&base).await;
    let settings = short_poll();
    let poll = settings.poll_interval;
    let a = state(db::open(&url).await.unwrap(), settings.clone()).await;
    let b = state(db::open(&url).await.unwrap(), settings).await;
    let (_bg_a, _bg_b) = (a.spawn_background(), b.spawn_background());
    let (url_a, url_b) = (serve(a).await, serve(b).await);
    let client = reqwest::Client::new();

    for round in 0..3 {
        let name = format!("shared{round}");
        let (s, v) = put(&client, &url_a, &name, quota(5.0 + round as f64, 1.0, 2.0, None)).await;
        assert_eq!(s, 200, "{v}");
        let epoch = v["epoch"].as_u64().unwrap();
        let written = Instant::now();
        // Root B's limiter asks from the epoch before this write.
        loop {
            let (s, v) = sync(&client, &url_b, "limiter-b", epoch - 1).await;
            assert_eq!(s, 200, "{v}");
            if v["quotas"].as_array().unwrap().iter().any(|q| q["name"] == name.as_str()) {
                assert_eq!(v["epoch"].as_u64(), Some(epoch));
                break;
            }
            // Two polls, and 200 ms for a loaded machine's scheduling (both roots, their
            // pollers and this client share two threads); under the default 1 s poll.
            assert!(
                written.elapsed() <= 2 * poll + Duration::from_millis(200),
                "root B did not serve {name} within 2 x {poll:?} (+200 ms)"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        eprintln!("round {round}: root B served the quota {:?} after the write", written.elapsed());
    }
    // A delete through B reaches A the same way, as a tombstone.
    let r = client.delete(format!("{url_b}/v1/quotas/shared0")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let tomb: Value = r.json().await.unwrap();
    let deadline = Instant::now() + 2 * poll + Duration::from_millis(200);
    loop {
        let (_, v) = sync(&client, &url_a, "limiter-a", tomb["epoch"].as_u64().unwrap() - 1).await;
        if v["quotas"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["name"] == "shared0" && q["deleted"] == true)
        {
            break;
        }
        assert!(Instant::now() < deadline, "root A missed the delete");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// SQLite made unwritable the way it happens in production: another process holds the
/// write lock (a backup, a stuck admin shell). Root ignores file permissions, so locking
/// is the honest way to refuse writes to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_locked_by_another_process() {
    use sqlx::Connection;
    let (store, url, _dir) = common::sqlite_store().await;
    let st = state(store, short_poll()).await;
    let _bg = st.spawn_background();
    let base = serve(st).await;
    let client = reqwest::Client::new();
    assert_eq!(put(&client, &base, "q", quota(1.0, 1.0, 2.0, None)).await.0, 200);

    let mut blocker = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE").execute(&mut blocker).await.unwrap();

    let syncing = {
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move {
            let mut answered = 0;
            for _ in 0..40 {
                let (s, v) = sync(&client, &base, "l1", 0).await;
                assert_eq!(s, 200, "sync failed while the database was locked: {v}");
                assert_eq!(v["quotas"][0]["name"], "q");
                answered += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            answered
        })
    };
    let (s, v) = put(&client, &base, "r", quota(1.0, 1.0, 2.0, None)).await;
    assert_eq!(s, 503, "{v}");
    assert!(v["error"].as_str().unwrap().contains("quota database unavailable"), "{v}");
    let r = client.delete(format!("{base}/v1/quotas/q")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let m = client.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(m.contains("yarl_root_db_errors_total 2"), "{m}");

    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    let (s, v) = put(&client, &base, "r", quota(1.0, 1.0, 2.0, None)).await;
    assert_eq!(s, 200, "writes did not recover: {v}");
    assert_eq!(syncing.await.unwrap(), 40);
}
