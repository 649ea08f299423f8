//! PostgreSQL stopped under running syncs, then started again. Its own test binary because
//! it stops the shared test cluster (other test binaries run before or after, never during).

mod common;

use common::{fresh_pg_db, pg_url, quota, serve, short_poll, state};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};
use yarl_root::db;

fn pg_ctl(action: &str) {
    let ctl = std::env::var("YARL_TEST_PG_CTL")
        .expect("YARL_TEST_PG_CTL (set by scripts/with-postgres.sh)");
    let out = Command::new(&ctl).arg(action).output().unwrap();
    assert!(out.status.success(), "{ctl} {action}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncs_survive_a_postgres_outage_and_writes_recover() {
    let Some(base) = pg_url("syncs_survive_a_postgres_outage_and_writes_recover") else { return };
    if std::env::var_os("YARL_TEST_PG_CTL").is_none() {
        assert!(
            !common::pg_required(),
            "YARL_TEST_PG_CTL not set but PostgreSQL tests are required: run under \
             scripts/with-postgres.sh"
        );
        eprintln!("skipped: YARL_TEST_PG_CTL not set (run under scripts/with-postgres.sh)");
        return;
    }
    let url = fresh_pg_db(&base).await;
    let st = state(db::open(&url).await.unwrap(), short_poll()).await;
    let _bg = st.spawn_background();
    let root = serve(st).await;
    let client = reqwest::Client::new();
    let put = |name: &str| {
        client
            .put(format!("{root}/v1/quotas/{name}"))
            .header("content-type", "application/json")
            .body(quota(2.0, 1.0, 5.0, None))
            .send()
    };
    assert_eq!(put("before").await.unwrap().status(), 200);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syncing = {
        let (client, root, stop) = (client.clone(), root.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seq = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && seq < 2_000 {
                seq += 1;
                let body =
                    json!({"v":1,"limiter":"l1","batches":[{"seq":seq,"deltas":[[1,100,0]]}]});
                let r = client.post(format!("{root}/v1/sync")).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 200, "sync failed during the outage");
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["acked_seq"], seq);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seq
        })
    };

    pg_ctl("stop");
    let down = Instant::now();
    let r = put("during").await.unwrap();
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("quota database unavailable"), "{v}");
    // Give the poller a few failing rounds too.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let h: Value =
        client.get(format!("{root}/healthz")).send().await.unwrap().json().await.unwrap();
    assert_eq!(h["database"], "down", "{h}");
    eprintln!("database down for {:?}", down.elapsed());
    pg_ctl("start");

    // Recovers by itself: writes succeed again within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = put("after").await.unwrap();
        if r.status() == 200 {
            break;
        }
        assert_eq!(r.status(), 503);
        assert!(Instant::now() < deadline, "writes did not recover after PostgreSQL restarted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = client.get(format!("{root}/v1/quotas/after")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let syncs = syncing.await.unwrap();
    assert!(syncs > 20, "only {syncs} syncs ran");
    // The counter kept counting in memory through the outage.
    let v: Value =
        client.get(format!("{root}/v1/quotas/before")).send().await.unwrap().json().await.unwrap();
    assert!(v["counter"]["rate"].as_f64().unwrap() > 0.0, "{v}");
}
