//! Sharded roots: each counter is summed by the roots of its shard only, a limiter sends
//! each delta to its counter's shard, and a parent chain spanning shards keeps working.

use std::sync::Arc;
use std::time::Duration;
use yarl_core::proto::v2;
use yarl_core::{
    Clock, Limiter, Limits, ManualClock, Outcome, QuotaUpdate, RootConfig, RootState, SeededRandom,
    Shard, SyncConfig, SyncEngine,
};

const S: u64 = 1_000_000_000;

fn quota(id: u64, name: &str, parent: Option<&str>) -> QuotaUpdate {
    QuotaUpdate {
        id,
        name: name.into(),
        epoch: id,
        deleted: false,
        limits: Limits::from_units(1.0, 10.0, 10.0).unwrap(),
        parent: parent.map(Into::into),
        reset_epoch: 0,
    }
}

/// Ids 1 and 2 live on different shards of two.
const PARENT: u64 = 1;
const CHILD: u64 = 2;

fn roots() -> Vec<RootState> {
    assert_ne!(Shard::of(PARENT, 2), Shard::of(CHILD, 2));
    (0..2)
        .map(|k| {
            let shard = Some(Shard { index: k, count: 2 });
            let mut r = RootState::new(RootConfig { shard, ..RootConfig::default() });
            r.apply_quotas(
                [quota(PARENT, "parent", None), quota(CHILD, "child", Some("parent"))],
                0,
            );
            r
        })
        .collect()
}

fn limiter(clock: &ManualClock, shards: Vec<Vec<String>>) -> (SyncEngine, Arc<Limiter>) {
    let l = Arc::new(
        Limiter::builder().clock(Arc::new(clock.clone())).random(SeededRandom::new(3)).build(),
    );
    (SyncEngine::sharded(l.clone(), shards, SyncConfig::default()).unwrap(), l)
}

fn two_shards() -> Vec<Vec<String>> {
    vec![vec!["http://s0".into()], vec!["http://s1".into()]]
}

/// One round; every message goes through protocol v2.
fn round(e: &mut SyncEngine, roots: &mut [RootState], urls: &[&str], now: u64) {
    for call in e.begin_round(now) {
        let k = urls.iter().position(|u| *u == call.url).unwrap();
        let req = v2::decode_request(&v2::encode_request(&call.request), usize::MAX).unwrap();
        let r = roots[k].sync(&req, now).map_err(|e| e.to_string());
        let r = r.map(|a| v2::decode_response(&v2::encode_response(&a), usize::MAX).unwrap());
        e.on_response(call.root, r, Duration::from_millis(1), now);
    }
    e.end_round(now);
}

#[test]
fn a_chain_across_shards_is_summed_where_each_counter_lives() {
    let clock = ManualClock::at(S);
    let mut roots = roots();
    let urls = ["http://s0", "http://s1"];
    let (mut a, la) = limiter(&clock, two_shards());
    let (mut b, lb) = limiter(&clock, two_shards());
    round(&mut a, &mut roots, &urls, clock.now_nanos());
    round(&mut b, &mut roots, &urls, clock.now_nanos());
    assert_eq!(la.quota_count(), 2, "quotas come from every root");

    for _ in 0..6 {
        assert_eq!(la.account("child", 1).unwrap().outcome, Outcome::Passed);
    }
    round(&mut a, &mut roots, &urls, clock.now_nanos());
    // Each root holds only its shard's counter.
    let (p, c) = (Shard::of(PARENT, 2) as usize, Shard::of(CHILD, 2) as usize);
    let now = clock.now_nanos();
    assert_eq!(roots[p].counter(PARENT, now).unwrap().fill, 6.0);
    assert_eq!(roots[p].counter(CHILD, now).unwrap().fill, 0.0, "not this root's shard");
    assert_eq!(roots[c].counter(CHILD, now).unwrap().fill, 6.0);
    assert_eq!(roots[c].counter(PARENT, now).unwrap().fill, 0.0);

    round(&mut b, &mut roots, &urls, clock.now_nanos());
    assert_eq!(lb.quota("child").unwrap().fill, 6.0, "b sees a's child counts");
    assert_eq!(lb.quota("parent").unwrap().fill, 6.0, "and its parent's, from the other shard");
    // The parent is the limit for b too: up to a fill of 10 everything passes, then not.
    for _ in 0..5 {
        assert_eq!(lb.account("child", 1).unwrap().outcome, Outcome::Passed);
    }
    assert_eq!(lb.check("child").outcome, Outcome::Rejected);
    assert!(b.status(now).cluster_fresh);
}

#[test]
fn a_root_of_another_shard_is_refused() {
    let clock = ManualClock::at(S);
    let mut roots = roots();
    // Shards listed the wrong way round.
    let (mut e, _) = limiter(&clock, vec![vec!["http://s1".into()], vec!["http://s0".into()]]);
    round(&mut e, &mut roots, &["http://s0", "http://s1"], clock.now_nanos());
    let st = e.status(clock.now_nanos());
    let err = st.roots[0].last_error.clone().unwrap();
    assert_eq!(err, "root serves shard 1/2, configured as shard 0/2");
    // An unsharded limiter against a sharded root.
    let l = Arc::new(Limiter::builder().clock(Arc::new(clock.clone())).build());
    let mut e = SyncEngine::new(l, vec!["http://s0".into()], SyncConfig::default()).unwrap();
    round(&mut e, &mut roots, &["http://s0", "http://s1"], clock.now_nanos());
    let err = e.status(clock.now_nanos()).roots[0].last_error.clone().unwrap();
    assert_eq!(err, "root serves shard 0/2, configured as every counter");
}

#[test]
fn shard_maps_are_checked() {
    let l = || Arc::new(Limiter::builder().build());
    let err = |s: Vec<Vec<&str>>| {
        let s = s.into_iter().map(|v| v.into_iter().map(String::from).collect()).collect();
        SyncEngine::sharded(l(), s, SyncConfig::default()).unwrap_err().to_string()
    };
    assert_eq!(err(vec![vec!["http://a"], vec![]]), "bad shard map: shard 1/2 has no roots");
    assert_eq!(
        err(vec![vec!["http://a"], vec!["http://a/"]]),
        "bad shard map: root http://a/ is listed twice"
    );
    let many: Vec<String> = (0..65).map(|i| format!("http://r{i}")).collect();
    let e = SyncEngine::new(l(), many, SyncConfig::default()).unwrap_err();
    assert_eq!(e.to_string(), "65 roots, the most a limiter syncs with is 64");
}
