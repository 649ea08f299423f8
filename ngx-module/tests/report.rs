//! The `yarl_stats` document (see tests/parse.rs for why the source is included directly).

#[allow(dead_code)]
#[path = "../src/report.rs"]
mod report;

use report::*;
use serde_json::Value;
use yarl_core::sync::RootStatus;
use yarl_core::{
    ConcurrencyInfo, ConcurrencyStatus, QuotaInfo, TemplateKeys, ZoneStatus, ZoneUsage,
};

fn roots() -> Vec<RootStatus> {
    vec![
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
    ]
}

fn zone() -> ZoneStatus {
    ZoneStatus {
        limiter_id: "00000000000000ab".into(),
        generation: 2,
        epoch: 9,
        rejections: 5,
        rounds: 40,
        early_rounds: 3,
        cluster_fresh: true,
        cluster_limiters: 12,
        last_round_end_ns: 9_900_000_000,
        agent: Some(77),
        agent_age_ms: 120,
        agent_starts: 2,
        write_waits: 3,
        write_overlaps: 0,
        usage: ZoneUsage { quotas: 3, capacity: 190_000, missing: 4, ..ZoneUsage::default() },
    }
}

fn parse(s: &str) -> Value {
    assert!(s.ends_with('\n'));
    serde_json::from_str(s).unwrap()
}

#[test]
fn the_host_state_with_ages_relative_to_render_time() {
    let (z, r) = (zone(), roots());
    let page = parse(&render(&Input {
        pid: 42,
        zone: Some(&z),
        agent_alive: true,
        now_ns: 10_000_000_000,
        roots: &r,
        sync: SyncSettings { interval_ms: 1000, timeout_ms: 500, early: true, answers: "all" },
        requests: RequestCounters { checked: 4, passed: 2, rejected: 2, ..Default::default() },
        quota: None,
        templates: &[
            TemplateKeys { template: Some("api_key_*".into()), keys: 7, evictions: 1, refused: 0 },
            TemplateKeys { template: None, keys: 3, evictions: 0, refused: 2 },
        ],
        concurrency: Some(&ConcurrencyStatus {
            quotas: vec![
                ConcurrencyInfo {
                    name: "uploads".into(),
                    id: 4,
                    keys: 0,
                    in_flight: 3,
                    share: 5,
                    refused: 11,
                },
                ConcurrencyInfo {
                    name: "gen_*".into(),
                    id: 9,
                    keys: 40,
                    in_flight: 12,
                    share: 60,
                    refused: 0,
                },
            ],
            entries_refused: 0,
            refused: 11,
            ledger_full: 1,
            reaped: 2,
        }),
    }));
    assert_eq!(page["pid"], 42);
    assert_eq!(page["limiter_id"], "00000000000000ab");
    assert_eq!(page["cluster_limiters"], 12);
    assert_eq!(page["sync_running"], true);
    assert_eq!(page["agent"]["pid"], 77);
    assert_eq!(page["agent"]["here"], false);
    assert_eq!(
        (page["agent"]["write_waits"].as_u64(), page["agent"]["write_overlaps"].as_u64()),
        (Some(3), Some(0))
    );
    assert_eq!(page["epoch"], 9);
    assert_eq!(page["quotas"], 3);
    assert_eq!(page["rejections"], 5);
    assert_eq!(page["rounds"], 40);
    assert_eq!(page["early_rounds"], 3);
    assert_eq!(page["sync"]["early"], true);
    assert_eq!(page["last_round_age_ms"], 100);
    assert_eq!(page["zone"]["missing"], 4);
    assert_eq!(page["zone"]["capacity"], 190_000);
    assert_eq!(page["requests"]["rejected"], 2);
    let roots = page["roots"].as_array().unwrap();
    assert_eq!(roots.len(), 2);
    assert_eq!(roots[0]["last_attempt_age_ms"], 1000);
    assert_eq!(roots[0]["last_success_age_ms"], 1500);
    assert_eq!(roots[1]["ok"], false);
    assert_eq!(roots[1]["last_error"], "connection failed");
    assert_eq!(roots[1]["last_success_age_ms"], Value::Null);
    assert!(page.get("quota").is_none());
    let t = &page["zone"]["template_keys"];
    assert_eq!(t[0]["template"], "api_key_*");
    assert_eq!((t[0]["keys"].as_u64(), t[0]["evictions"].as_u64()), (Some(7), Some(1)));
    assert_eq!((&t[1]["template"], t[1]["refused"].as_u64()), (&Value::Null, Some(2)));
    let c = &page["concurrency"];
    assert_eq!((c["ledger_full"].as_u64(), c["reaped"].as_u64()), (Some(1), Some(2)));
    assert_eq!(c["refused"].as_u64(), Some(11));
    assert_eq!(c["quotas"][0]["quota"], "uploads");
    assert_eq!(
        (c["quotas"][0]["in_flight"].as_u64(), c["quotas"][0]["share"].as_u64()),
        (Some(3), Some(5))
    );
    assert_eq!(c["quotas"][0]["refused"], 11);
    assert!(c["quotas"][0].get("keys").is_none(), "a quota has no keys");
    assert_eq!(
        (&c["quotas"][1]["quota"], c["quotas"][1]["keys"].as_u64()),
        (&"gen_*".into(), Some(40))
    );
}

#[test]
fn without_a_zone_and_with_a_quota_query() {
    let info = QuotaInfo {
        id: 3,
        epoch: 5,
        limit: 10.0,
        window: 3_600,
        low_burst: 2.0,
        high_burst: 4.0,
        dry_run: true,
        parent: Some("p".into()),
        fill: 3.5,
        rejections: 7,
        template: None,
    };
    let page = parse(&render(&Input {
        pid: 1,
        zone: None,
        agent_alive: false,
        now_ns: 0,
        roots: &[],
        sync: SyncSettings::default(),
        requests: RequestCounters::default(),
        quota: Some(("q", Some(&info))),
        templates: &[],
        concurrency: None,
    }));
    assert_eq!(page["sync_running"], false);
    assert_eq!(page["agent"]["pid"], Value::Null);
    assert_eq!(page["roots"].as_array().unwrap().len(), 0);
    assert_eq!(page["quota"]["name"], "q");
    assert_eq!(page["quota"]["parent"], "p");
    assert_eq!(page["quota"]["fill"], 3.5);
    assert_eq!(page["quota"]["rejections"], 7);
    assert_eq!(page["quota"]["dry_run"], true);
    assert_eq!(
        (&page["quota"]["limit"], &page["quota"]["per"]),
        (&Value::from(10.0), &Value::from("1h"))
    );

    let missing = parse(&render(&Input {
        pid: 1,
        zone: None,
        agent_alive: false,
        now_ns: 0,
        roots: &[],
        sync: SyncSettings::default(),
        requests: RequestCounters::default(),
        quota: Some(("nope", None)),
        templates: &[],
        concurrency: None,
    }));
    assert_eq!(missing["quota"], Value::Null);
}
