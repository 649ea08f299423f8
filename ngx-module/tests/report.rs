//! The `yarl_stats` document (see tests/parse.rs for why the source is included directly).

#[allow(dead_code)]
#[path = "../src/report.rs"]
mod report;

use report::*;
use serde_json::Value;
use yarl_core::sync::RootStatus;
use yarl_core::{QuotaInfo, SyncStatus};

fn status() -> SyncStatus {
    SyncStatus {
        limiter_id: "abc".into(),
        roots: vec![
            RootStatus {
                url: "http://127.0.0.1:7700".into(),
                ok: Some(true),
                last_attempt_ns: Some(9_000_000_000),
                last_success_ns: Some(8_500_000_000),
                last_latency_us: Some(800),
                successes: 12,
                ..RootStatus::default()
            },
            RootStatus {
                url: "http://127.0.0.1:7701".into(),
                ok: Some(false),
                last_error: Some("connection failed".into()),
                last_attempt_ns: Some(9_000_000_000),
                failures: 3,
                consecutive_failures: 3,
                ..RootStatus::default()
            },
        ],
        epoch: 7,
        quotas: 2,
        rejections: 1,
        rounds: 40,
        cluster_fresh: true,
        now_ns: 9_100_000_000,
    }
}

fn parse(s: &str) -> Value {
    assert!(s.ends_with('\n'));
    serde_json::from_str(s).unwrap()
}

#[test]
fn ages_are_relative_to_render_time() {
    let st = status();
    let page = parse(&render(&Input {
        pid: 42,
        status: Some(&st),
        live: Live { now_ns: 10_000_000_000, epoch: 9, quotas: 3, rejections: 5 },
        sync: SyncSettings { interval_ms: 1000, timeout_ms: 500 },
        requests: RequestCounters { checked: 4, passed: 2, rejected: 2, ..Default::default() },
        quota: None,
    }));
    assert_eq!(page["pid"], 42);
    assert_eq!(page["sync_running"], true);
    // Live values win over the snapshot of the last round.
    assert_eq!(page["epoch"], 9);
    assert_eq!(page["quotas"], 3);
    assert_eq!(page["rejections"], 5);
    assert_eq!(page["rounds"], 40);
    assert_eq!(page["requests"]["rejected"], 2);
    let roots = page["roots"].as_array().unwrap();
    assert_eq!(roots.len(), 2);
    assert_eq!(roots[0]["last_attempt_age_ms"], 1000);
    assert_eq!(roots[0]["last_success_age_ms"], 1500);
    assert_eq!(roots[1]["ok"], false);
    assert_eq!(roots[1]["last_error"], "connection failed");
    assert_eq!(roots[1]["last_success_age_ms"], Value::Null);
    assert!(page.get("quota").is_none());
}

#[test]
fn without_a_thread_and_with_a_quota_query() {
    let info = QuotaInfo {
        id: 3,
        epoch: 5,
        limit: 10.0,
        low_burst: 2.0,
        high_burst: 4.0,
        parent: Some("p".into()),
        fill: 3.5,
    };
    let page = parse(&render(&Input {
        pid: 1,
        status: None,
        live: Live::default(),
        sync: SyncSettings::default(),
        requests: RequestCounters::default(),
        quota: Some(("q", Some(&info))),
    }));
    assert_eq!(page["sync_running"], false);
    assert_eq!(page["roots"].as_array().unwrap().len(), 0);
    assert_eq!(page["quota"]["name"], "q");
    assert_eq!(page["quota"]["parent"], "p");
    assert_eq!(page["quota"]["fill"], 3.5);

    let missing = parse(&render(&Input {
        pid: 1,
        status: None,
        live: Live::default(),
        sync: SyncSettings::default(),
        requests: RequestCounters::default(),
        quota: Some(("nope", None)),
    }));
    assert_eq!(missing["quota"], Value::Null);
}
