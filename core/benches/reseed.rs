//! What durability costs for windowed quotas: a million active keys of a daily template
//! (`k_*`, 1,000 per day), and a root that restarts (or joins) with none of them.
//!
//! Roots write no counter to the database: the limiters that counted a key hold its fill in
//! their zone and hint it to a root they meet anew (merged by max, or added to the root's
//! own sums when the view is older than the root: both are measured). So the cost is not
//! database writes per second (there are none, whatever the number of keys) but, once per
//! restarted root, a hint per active key from each limiter, 250,000 a call (so four calls
//! for a million, in four rounds): this bench measures their size on the v2 wire, the time a
//! root takes to decode and apply them, and the error left (the restored fills against the
//! ones the limiter sent).
//!
//! Run: `cargo bench -p yarl-core --bench reseed` (part of `make bench`).

use std::time::Instant;
use yarl_core::proto::{v2, SyncRequest, PROTOCOL_VERSION};
use yarl_core::zone::keys::key_id;
use yarl_core::{QuotaSpec, QuotaUpdate, RootConfig, RootState};

const KEYS: u64 = 1_000_000;
const SECOND: u64 = 1_000_000_000;
const SECRET: (u64, u64) = (0x5eed_0001, 0x5eed_0002);
/// What one sync call carries at most (the engine's `MAX_HINTS_PER_CALL`).
const HINTS_PER_CALL: usize = 250_000;

fn fresh_root() -> RootState {
    let spec = QuotaSpec {
        limit: Some(1_000.0),
        per: Some("1d".into()),
        low_burst: None,
        high_burst: None,
        parent: None,
        dry_run: false,
        max_in_flight: None,
    };
    let limits = spec.validate("k_*").expect("valid");
    let mut root = RootState::new(RootConfig::default());
    root.set_key_secret(SECRET);
    root.apply_quotas(
        [QuotaUpdate {
            id: 1,
            name: "k_*".into(),
            epoch: 1,
            deleted: false,
            reset_epoch: 0,
            limits,
            parent: None,
        }],
        1,
    );
    root
}

fn main() {
    // The limiter's view: a million keys, each with some of its day used (1 to 1,000 units).
    let mut rng = fastrand::Rng::with_seed(11);
    let mut hints: Vec<(u64, u64)> = (0..KEYS)
        .map(|i| (key_id(SECRET, format!("k_client-{i}").as_bytes()), 1_000 * rng.u64(1..=1_000)))
        .collect();
    hints.sort_unstable_by_key(|h| h.0);
    hints.dedup_by_key(|h| h.0);
    let mut calls: Vec<SyncRequest> = hints
        .chunks(HINTS_PER_CALL)
        .map(|chunk| SyncRequest {
            v: PROTOCOL_VERSION,
            limiter: "reseed".into(),
            root_instance: None,
            since: 0,
            epoch: 1,
            batches: Vec::new(),
            key_templates: chunk.iter().map(|h| (h.0, 1)).collect(),
            hinted_seq: None,
            hints: chunk.to_vec(),
            seen_epoch: Some(1),
            interest: false,
            watch: Vec::new(),
            in_flight: Vec::new(),
            view_age_ns: None,
        })
        .collect();
    let bodies: Vec<Vec<u8>> = calls.iter().map(v2::encode_request).collect();
    let bytes: usize = bodies.iter().map(Vec::len).sum();
    println!(
        "re-seeding a restarted root: {} active keys of a daily template from one limiter",
        hints.len()
    );
    println!(
        "  {} calls on the v2 wire: {:.1} MB ({:.1} bytes per key)",
        bodies.len(),
        bytes as f64 / 1e6,
        bytes as f64 / hints.len() as f64
    );
    // Views answered 1 s before the sync, the root started 0.5 s before it: older than
    // the root, so added (each key's first hint: the highest so far).
    let now = 2 * SECOND;
    let aged: Vec<Vec<u8>> = calls
        .iter_mut()
        .map(|c| {
            c.view_age_ns = Some(SECOND);
            v2::encode_request(c)
        })
        .collect();
    for (how, bodies, started) in
        [("merged by max", &bodies, None), ("added", &aged, Some(now - SECOND / 2))]
    {
        let mut best = f64::MAX;
        let mut worst_error = 0u64;
        for _ in 0..3 {
            let mut root = fresh_root();
            if let Some(s) = started {
                root.start(s);
            }
            let t0 = Instant::now();
            for body in bodies {
                // The root's default entry limit.
                let decoded = v2::decode_request(body, 2_000_000).expect("decodes");
                root.sync(&decoded, now).expect("applied");
            }
            best = best.min(t0.elapsed().as_secs_f64());
            assert_eq!(root.stats().hints_added > 0, started.is_some());
            // Every key is back at what the limiter held (a hint is cut only at the
            // ceiling, high_burst + a quarter second of the limit, above any honest fill).
            for &(id, fill) in hints.iter().step_by(997) {
                let got = root.counter(id, now).map_or(0.0, |c| c.fill);
                let err = (fill as f64 / 1e3 - got).abs();
                worst_error = worst_error.max((err * 1e3).round() as u64);
            }
        }
        println!(
            "  {how}: decoded and applied in {:.2} s (best of 3; {:.0} ns per key); largest \
             error of a restored fill (every 997th key): {worst_error} milli-units",
            best,
            best * 1e9 / hints.len() as f64
        );
    }
    println!("  database writes per second for durability: 0 (at any number of keys)");
}
