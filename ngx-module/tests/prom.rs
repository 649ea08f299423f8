//! The `yarl_metrics` page (see tests/parse.rs for why the sources are included directly).

#[allow(dead_code)]
#[path = "../src/report.rs"]
mod report;

#[allow(dead_code)]
#[path = "../src/prom.rs"]
mod prom;

use prom::*;
use report::RequestCounters;
use yarl_core::sync::RootStatus;
use yarl_core::zone::roots::LATENCY_BUCKETS_US;
use yarl_core::{ConcurrencyInfo, ConcurrencyStatus, TemplateKeys, ZoneStatus, ZoneUsage};

fn zone() -> ZoneStatus {
    ZoneStatus {
        limiter_id: "00000000000000ab".into(),
        generation: 3,
        epoch: 9,
        rejections: 100,
        rounds: 40,
        early_rounds: 2,
        cluster_fresh: true,
        cluster_limiters: 12,
        last_round_end_ns: 9_500_000_000,
        agent: Some(7),
        agent_age_ms: 10,
        agent_starts: 1,
        write_waits: 0,
        write_overlaps: 0,
        usage: ZoneUsage {
            quotas: 30,
            capacity: 1000,
            missing: 2,
            bytes: 1 << 20,
            bytes_used: 4096,
            ..ZoneUsage::default()
        },
    }
}

fn root(url: &str) -> RootStatus {
    let mut counts = vec![0; LATENCY_BUCKETS_US.len() + 1];
    counts[2] = 5;
    counts[LATENCY_BUCKETS_US.len()] = 1;
    RootStatus {
        url: url.into(),
        ok: Some(true),
        successes: 6,
        failures: 2,
        latency_buckets_us: LATENCY_BUCKETS_US.to_vec(),
        latency_counts: counts,
        latency_sum_us: 2_004_000,
        ..RootStatus::default()
    }
}

/// `n` templates, the i-th holding i keys, and the zone's `_other` row.
fn templates(n: u64) -> Vec<TemplateKeys> {
    let mut rows: Vec<TemplateKeys> = (1..=n)
        .map(|i| TemplateKeys {
            template: Some(format!("t{i}_*")),
            keys: i,
            evictions: 1,
            refused: 2,
        })
        .collect();
    rows.push(TemplateKeys { template: None, keys: 100, evictions: 10, refused: 20 });
    rows
}

fn lines_of<'a>(page: &'a str, metric: &str) -> Vec<&'a str> {
    page.lines().filter(|l| l.starts_with(metric)).collect()
}

#[test]
fn every_family_is_typed_and_values_add_up() {
    let z = zone();
    let top: Vec<(String, u64, u64)> =
        (0..25).map(|i| (format!("q{i}"), 25 - i as u64, 2)).collect();
    let roots = [root("http://r1:7700"), root("https://r\"2")];
    let tpl = templates(25);
    let page = render(&Input {
        templates: &tpl,
        requests: RequestCounters {
            checked: 10,
            passed: 6,
            unlimited: 1,
            rejected: 2,
            rejected_dry_run: 1,
        },
        zone: Some(&z),
        top: &top,
        roots: &roots,
        agent_alive: true,
        now_ns: 10_000_000_000,
        concurrency: Some(&concurrency(25)),
    });
    // Every sample belongs to a family declared just before with HELP and TYPE.
    let mut declared = Vec::new();
    for l in page.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            declared.push(rest.split(' ').next().unwrap().to_string());
        } else if !l.starts_with('#') {
            let name = l.split(['{', ' ']).next().unwrap();
            let family = name
                .strip_suffix("_bucket")
                .or_else(|| name.strip_suffix("_sum"))
                .or_else(|| name.strip_suffix("_count"))
                .filter(|f| declared.iter().any(|d| d == f))
                .unwrap_or(name);
            assert!(declared.iter().any(|d| d == family), "{l}: undeclared");
        }
    }
    assert!(page.contains("yarl_requests_total{status=\"rejected_dry_run\"} 1\n"));
    assert!(page.contains("yarl_cluster_limiters 12\n"));
    // 20 quotas by name, no "rest" (it would go down when a quota joins the named ones):
    // the total is yarl_rejections_total.
    let q = lines_of(&page, "yarl_quota_rejections_total{");
    assert_eq!(q.len(), TOP_QUOTAS, "{q:?}");
    assert!(!page.contains("_other\"} 60"), "no rest of a counter");
    assert!(page.contains("yarl_rejections_total 100\n"));
    // The histogram is cumulative, ends with +Inf = count, in seconds.
    let b = lines_of(&page, "yarl_sync_duration_seconds_bucket{root=\"http://r1:7700\"");
    assert_eq!(b.len(), LATENCY_BUCKETS_US.len() + 1);
    assert_eq!(b[2], "yarl_sync_duration_seconds_bucket{root=\"http://r1:7700\",le=\"0.001\"} 5");
    assert_eq!(
        b.last().unwrap(),
        &"yarl_sync_duration_seconds_bucket{root=\"http://r1:7700\",le=\"+Inf\"} 6"
    );
    assert!(page.contains("yarl_sync_duration_seconds_sum{root=\"http://r1:7700\"} 2.004\n"));
    assert!(
        page.contains("yarl_sync_requests_total{root=\"https://r\\\"2\",result=\"failed\"} 2\n"),
        "label escaped"
    );
    // 20 templates by name, most keys first, and the rest with the zone's own _other row.
    let t = lines_of(&page, "yarl_template_keys{");
    assert_eq!(t.len(), TOP_TEMPLATES + 1, "{t:?}");
    assert_eq!(t[0], "yarl_template_keys{template=\"t25_*\"} 25");
    assert_eq!(t.last().unwrap(), &"yarl_template_keys{template=\"_other\"} 115");
    assert!(!page.contains("yarl_template_key_evictions_total{template=\"_other\"}"));
    assert_eq!(lines_of(&page, "yarl_template_key_evictions_total{").len(), TOP_TEMPLATES);
    assert!(page.contains("yarl_template_keys_refused_total{template=\"t6_*\"} 2\n"));
    assert!(!page.contains("template=\"t5_*\""), "t1..t5 hold fewest: in _other");
    assert!(page.contains("yarl_quotas_missing 2\n"));
    assert!(page.contains("yarl_sync_last_round_age_seconds 0.500\n"));
    assert!(page.contains("yarl_sync_agent_up 1\n"));
    // 20 concurrency quotas by name, most in flight first, the rest summed.
    let c = lines_of(&page, "yarl_concurrency_in_flight{");
    assert_eq!(c.len(), TOP_QUOTAS + 1, "{c:?}");
    assert_eq!(c[0], "yarl_concurrency_in_flight{quota=\"c24\"} 24");
    assert_eq!(c.last().unwrap(), &"yarl_concurrency_in_flight{quota=\"_other\"} 10");
    assert!(page.contains("yarl_concurrency_share{quota=\"c24\"} 25\n"));
    assert!(!page.contains("yarl_concurrency_refused_total{quota=\"_other\"}"));
    assert_eq!(lines_of(&page, "yarl_concurrency_refused_total{").len(), TOP_QUOTAS);
    assert!(page.contains("yarl_concurrency_refusals_total 75\n"));
    assert!(page.contains("yarl_concurrency_reaped_total 3\n"));
    assert!(page.contains("yarl_concurrency_entries_refused_total 0\n"));
    assert!(page.contains("yarl_concurrency_ledger_full_total 0\n"));
}

/// `n` concurrency quotas: `c{i}` with `i` in flight, a share of `i + 1`, 3 refused.
fn concurrency(n: u32) -> ConcurrencyStatus {
    ConcurrencyStatus {
        quotas: (0..n)
            .map(|i| ConcurrencyInfo {
                name: format!("c{i}"),
                id: u64::from(i) + 1,
                keys: 0,
                in_flight: i,
                share: i + 1,
                refused: 3,
            })
            .collect(),
        entries_refused: 0,
        refused: u64::from(n) * 3,
        ledger_full: 0,
        reaped: 3,
    }
}

#[test]
fn the_page_is_bounded_whatever_the_quotas() {
    let z = zone();
    let top: Vec<(String, u64, u64)> = (0..5000).map(|i| (format!("quota-{i}"), 1, 1)).collect();
    let roots: Vec<RootStatus> = (0..3).map(|i| root(&format!("http://r{i}"))).collect();
    let tpl = templates(64);
    let page = render(&Input {
        templates: &tpl,
        requests: RequestCounters::default(),
        zone: Some(&z),
        top: &top,
        roots: &roots,
        agent_alive: false,
        now_ns: 0,
        concurrency: Some(&concurrency(1024)),
    });
    let lines = page.lines().count();
    assert!(lines < 320, "{lines} lines");
}

/// A quota named `_other` (a legal name): a counter has no aggregate, so it is named like
/// any other; a gauge counts it in the aggregate (named too, it would make a second
/// `quota="_other"` series, which Prometheus drops).
#[test]
fn a_quota_named_other_is_named_in_counters_and_summed_in_gauges() {
    let z = zone();
    let top: Vec<(String, u64, u64)> =
        vec![("_other".into(), 9, 7), ("a".into(), 5, 3), ("b".into(), 1, 1)];
    let mut c = concurrency(3);
    c.quotas[2].name = "_other".into();
    let page = render(&Input {
        templates: &[],
        requests: RequestCounters::default(),
        zone: Some(&z),
        top: &top,
        roots: &[],
        agent_alive: true,
        now_ns: 10_000_000_000,
        concurrency: Some(&c),
    });
    let q = lines_of(&page, "yarl_quota_rejections_total{");
    assert_eq!(
        q,
        [
            "yarl_quota_rejections_total{quota=\"_other\"} 7",
            "yarl_quota_rejections_total{quota=\"a\"} 3",
            "yarl_quota_rejections_total{quota=\"b\"} 1"
        ]
    );
    let f = lines_of(&page, "yarl_concurrency_in_flight{");
    assert_eq!(
        f,
        [
            "yarl_concurrency_in_flight{quota=\"c1\"} 1",
            "yarl_concurrency_in_flight{quota=\"c0\"} 0",
            "yarl_concurrency_in_flight{quota=\"_other\"} 2"
        ]
    );
}
