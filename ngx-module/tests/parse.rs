//! The nginx-free parts of the module: directive values and runtime weights.
//!
//! The library itself cannot be linked into a test executable (it references nginx's
//! symbols), so the pure module is compiled in here directly.

#[allow(dead_code)]
#[path = "../src/parse.rs"]
mod parse;

use parse::*;

#[test]
fn flags_are_on_or_off() {
    assert_eq!(parse_flag("on"), Some(true));
    assert_eq!(parse_flag("OFF"), Some(false));
    assert_eq!(parse_flag("yes"), None);
    assert_eq!(parse_flag(""), None);
}

#[test]
fn status_is_bounded_like_limit_req_status() {
    assert_eq!(parse_status("429"), Some(429));
    assert_eq!(parse_status("400"), Some(400));
    assert_eq!(parse_status("599"), Some(599));
    for bad in ["399", "600", "200", "", "42x", "+429", "0429", "4290", "-1"] {
        assert_eq!(parse_status(bad), None, "{bad:?}");
    }
}

#[test]
fn log_levels() {
    assert_eq!(parse_log_level("info"), Some(LogLevel::Info));
    assert_eq!(parse_log_level("notice"), Some(LogLevel::Notice));
    assert_eq!(parse_log_level("warn"), Some(LogLevel::Warn));
    assert_eq!(parse_log_level("error"), Some(LogLevel::Error));
    assert_eq!(parse_log_level("debug"), None);
    assert_eq!(parse_log_level("crit"), None);
}

#[test]
fn config_weights() {
    assert_eq!(parse_weight("0"), Some(0));
    assert_eq!(parse_weight("1"), Some(1));
    assert_eq!(parse_weight("1000000000000"), Some(MAX_WEIGHT));
    for bad in ["1000000000001", "-1", "1.5", "", "abc", "99999999999999999999"] {
        assert_eq!(parse_weight(bad), None, "{bad:?}");
    }
}

#[test]
fn runtime_weights() {
    assert_eq!(runtime_weight(b""), RuntimeWeight::Empty);
    assert_eq!(runtime_weight(b"  "), RuntimeWeight::Empty);
    assert_eq!(runtime_weight(b"1234"), RuntimeWeight::Value(1234));
    assert_eq!(runtime_weight(b" 7 "), RuntimeWeight::Value(7));
    assert_eq!(runtime_weight(b"12a"), RuntimeWeight::Invalid);
    assert_eq!(runtime_weight(b"-5"), RuntimeWeight::Invalid);
    assert_eq!(runtime_weight(b"1000000000001"), RuntimeWeight::Clamped(MAX_WEIGHT));
    assert_eq!(runtime_weight(b"184467440737095516150"), RuntimeWeight::Clamped(MAX_WEIGHT));
    // One value per upstream tried (`proxy_next_upstream`), and across internal redirects.
    assert_eq!(runtime_weight(b"0, 1234"), RuntimeWeight::Value(1234));
    assert_eq!(runtime_weight(b"10, 20 : 30"), RuntimeWeight::Value(60));
    assert_eq!(runtime_weight(b"5,5"), RuntimeWeight::Value(10));
    assert_eq!(runtime_weight(b"5, "), RuntimeWeight::Invalid);
    assert_eq!(runtime_weight(b", 5"), RuntimeWeight::Invalid);
    assert_eq!(runtime_weight(b"5, -"), RuntimeWeight::Invalid);
    assert_eq!(runtime_weight(b"99999999999999, x"), RuntimeWeight::Invalid);
    assert_eq!(runtime_weight(b"600000000000, 600000000000"), RuntimeWeight::Clamped(MAX_WEIGHT));
    assert_eq!(
        runtime_weight(b"18446744073709551615, 18446744073709551615"),
        RuntimeWeight::Clamped(MAX_WEIGHT)
    );
    assert_eq!(runtime_weight(b"12a").units(), 0);
    assert_eq!(runtime_weight(b"").units(), 0);
    assert_eq!(runtime_weight(b"99999999999999").units(), MAX_WEIGHT);
}

#[test]
fn root_urls() {
    assert_eq!(parse_root_url("http://127.0.0.1:7700").unwrap(), "http://127.0.0.1:7700");
    assert_eq!(parse_root_url("http://root.example:80/").unwrap(), "http://root.example:80");
    assert_eq!(parse_root_url("HTTP://r/yarl/").unwrap(), "http://r/yarl");
    assert_eq!(parse_root_url("http://[::1]:7700").unwrap(), "http://[::1]:7700");
    assert_eq!(parse_root_url("HTTPS://r:7700/").unwrap(), "https://r:7700");
    assert!(parse_root_url("ftp://r").unwrap_err().contains("https://"));
    // Hosts the HTTP client could not use fail at `nginx -t`, not at every sync.
    assert_eq!(parse_root_url("http://a:b:80"), Err("invalid host"));
    assert_eq!(parse_root_url("http://::1:7700"), Err("invalid host"));
    assert_eq!(parse_root_url("http://[zz::1]:7700"), Err("invalid host"));
    for bad in [
        "127.0.0.1:7700",
        "http://",
        "http://:80",
        "http://r:0",
        "http://r:99999",
        "http://r:x",
        "http://r?a=1",
        "http://u:p@r",
        "http://r r",
        "http://[::1",
        "ftp://r",
    ] {
        assert!(parse_root_url(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn percent_decoding() {
    assert_eq!(percent_decode(b"a%3Ab%40c").as_deref(), Some(&b"a:b@c"[..]));
    assert_eq!(percent_decode(b"plain.name").as_deref(), Some(&b"plain.name"[..]));
    assert_eq!(percent_decode(b"bad%4"), None);
    assert_eq!(percent_decode(b"bad%zz"), None);
    // Any bytes: a key under a template may be a binary address.
    assert_eq!(percent_decode(b"ip_%7f%00%00%01").as_deref(), Some(&b"ip_\x7f\0\0\x01"[..]));
}

#[test]
fn zone_sizes() {
    assert!(check_zone_size(100 << 10, 0).unwrap_err().contains("at least 256k"));
    let small = check_zone_size(256 << 10, 0).unwrap();
    assert!(small >= 64, "{small}");
    let default = check_zone_size(DEFAULT_ZONE_SIZE, 0).unwrap();
    assert!((180_000..210_000).contains(&default), "32m holds {default}");
    // With the default key table, a quarter of it.
    let keys = parse_keys(None, DEFAULT_ZONE_SIZE).unwrap();
    assert!((60_000..70_000).contains(&keys), "32m keeps {keys} keys");
    let shared = check_zone_size(DEFAULT_ZONE_SIZE, keys).unwrap();
    assert!((135_000..160_000).contains(&shared), "and {shared} quotas");
    let big = check_zone_size(200 << 20, 0).unwrap();
    assert!(big > 1_000_000, "200m holds {big}");
    let max = max_zone_size(0);
    assert_eq!(check_zone_size(max, 0), Ok(yarl_core::zone::MAX_QUOTAS), "{max}");
    assert!(check_zone_size(max - (1 << 20), 0).unwrap() < yarl_core::zone::MAX_QUOTAS);
    let err = check_zone_size(max + 1, 0).unwrap_err();
    assert!(err.contains("at most 16777214 quotas"), "{err}");
    assert!(check_zone_size(8 << 30, 0).is_err());
    // Keys that leave no room for quotas.
    let err = check_zone_size(1 << 20, 1_000_000).unwrap_err();
    assert!(err.contains("leave no room for quotas"), "{err}");
}

#[test]
fn key_counts() {
    assert_eq!(parse_keys(Some("1000"), 64 << 20), Ok(1000));
    assert_eq!(parse_keys(Some("20k"), 64 << 20), Ok(20_000));
    assert_eq!(parse_keys(Some("2M"), 64 << 20), Ok(2_000_000));
    assert_eq!(parse_keys(Some("0"), 64 << 20), Ok(0));
    let half = parse_keys(Some("50%"), 64 << 20).unwrap();
    assert!(half.abs_diff(2 * parse_keys(Some("25%"), 64 << 20).unwrap()) <= 1, "{half}");
    for bad in ["", "x", "-1", "1g", "95%", "%", "99999999999m"] {
        assert!(parse_keys(Some(bad), 64 << 20).is_err(), "{bad:?}");
    }
}

#[test]
fn root_lines_and_shards() {
    use yarl_core::Shard;
    let s = |index, count| Some(Shard { index, count });
    let urls = |v: &[&str]| v.iter().map(|u| u.to_string()).collect::<Vec<_>>();
    assert_eq!(parse_shard_arg("shard=1/2"), Some(Ok(Shard { index: 1, count: 2 })));
    assert!(parse_shard_arg("shard=2/2").unwrap().unwrap_err().contains("INDEX/COUNT"));
    assert_eq!(parse_shard_arg("http://a"), None);

    let mut m = RootMap::default();
    m.add(None, urls(&["http://a", "http://b"])).unwrap();
    assert_eq!(m.add(None, urls(&["http://c"])).unwrap_err(), "is duplicate");
    assert!(m.add(s(0, 2), urls(&["http://c"])).unwrap_err().contains("one line without it"));
    assert_eq!(m.check(), Ok(()));
    assert_eq!(m.shards(), None);

    let mut m = RootMap::default();
    m.add(s(1, 2), urls(&["http://c"])).unwrap();
    assert!(m.check().unwrap_err().contains("shard=0/2"));
    assert!(m.add(s(0, 3), urls(&["http://d"])).unwrap_err().contains("same COUNT"));
    assert!(m.add(s(1, 2), urls(&["http://d"])).unwrap_err().contains("given twice"));
    assert!(m.add(s(0, 2), urls(&["http://c"])).unwrap_err().contains("listed twice"));
    m.add(s(0, 2), urls(&["http://a", "http://b"])).unwrap();
    assert_eq!(m.check(), Ok(()));
    assert_eq!(m.shards(), Some(vec![urls(&["http://a", "http://b"]), urls(&["http://c"])]));
    assert_eq!(m.all(), urls(&["http://c", "http://a", "http://b"]));

    let mut m = RootMap::default();
    let many: Vec<String> = (0..65).map(|i| format!("http://r{i}")).collect();
    assert!(m.add(None, many).unwrap_err().contains("at most 64"));
}

#[test]
fn parent_pids_from_proc_stat() {
    assert_eq!(ppid_of_stat("4242 (nginx) S 4200 4200 4200 0 -1 4194624 10"), Some(4200));
    // A command name with spaces and parentheses ends at the last ')'.
    assert_eq!(ppid_of_stat("77 (a b) (c)) R 1 77 77 0"), Some(1));
    assert_eq!(ppid_of_stat("77 (x) R"), None);
    assert_eq!(ppid_of_stat(""), None);
}
