//! Protocol v2: every message round-trips through the binary encoding, and a v1 (JSON)
//! answer and a v2 answer of the same message decode to the same thing.

use proptest::prelude::*;
use yarl_core::concurrency::{Grant, Report};
use yarl_core::proto::v2::{self, DecodeError};
use yarl_core::proto::{
    DeltaBatch, InFlightGrant, InFlightReport, SyncRequest, SyncResponse, PROTOCOL_VERSION,
};
use yarl_core::{Limits, QuotaUpdate};

/// Ids and amounts over the whole u64 range, with small values (what real messages carry)
/// drawn often.
fn num() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..300, 0u64..2_000_000, any::<u64>()]
}

fn name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._:@-]{1,40}"
}

fn request() -> impl Strategy<Value = SyncRequest> {
    (
        "[0-9a-f]{1,128}",
        prop::option::of(any::<u64>()),
        num(),
        num(),
        prop::collection::vec(
            (
                num(),
                prop::collection::vec((num(), num(), num()), 0..20),
                prop::option::of(num()),
                any::<bool>(),
            )
                .prop_map(|(seq, deltas, epoch, long)| {
                    // Either no amounts or one per delta, as a limiter sends them.
                    let drained =
                        if long { deltas.iter().map(|d| d.1 / 2).collect() } else { vec![] };
                    DeltaBatch { seq, deltas, epoch, drained }
                }),
            0..5,
        ),
        prop::collection::vec((num(), num()), 0..20),
        prop::option::of(num()),
        any::<bool>(),
        prop::collection::vec(num(), 0..20),
        prop::collection::vec((num(), num()), 0..20),
        prop::option::of(num()),
        (prop::collection::vec(in_flight_report(), 0..5), prop::option::of(num())),
    )
        .prop_map(
            |(
                limiter,
                root_instance,
                since,
                epoch,
                batches,
                hints,
                seen_epoch,
                interest,
                watch,
                key_templates,
                hinted_seq,
                (in_flight, view_age_ns),
            )| {
                SyncRequest {
                    v: PROTOCOL_VERSION,
                    limiter,
                    root_instance,
                    since,
                    epoch,
                    batches,
                    hints,
                    seen_epoch,
                    interest,
                    watch,
                    key_templates,
                    hinted_seq,
                    in_flight,
                    view_age_ns,
                }
            },
        )
}

fn quota() -> impl Strategy<Value = QuotaUpdate> {
    (
        (num(), name(), num(), any::<bool>()),
        (num(), num(), num(), prop::option::of(name())),
        (prop_oneof![Just(0u64), num()], any::<bool>(), prop_oneof![Just(0u32), 1u32..=1_000_000]),
    )
        .prop_map(
            |(
                (id, name, epoch, deleted),
                (limit, low_burst, high_burst, parent),
                (reset, dry, in_flight),
            )| {
                // Any valid numbers: a limit of 1..=1e15, bursts up to 1e18, in order.
                let (a, b) =
                    (low_burst % 1_000_000_000_000_000_001, high_burst % 1_000_000_000_000_000_001);
                let limits =
                    Limits::from_milli(1 + limit % 1_000_000_000_000_000, a.min(b), a.max(b))
                        .unwrap()
                        .with_dry_run(dry)
                        .with_max_in_flight(in_flight)
                        .unwrap();
                QuotaUpdate { id, name, epoch, deleted, limits, parent, reset_epoch: reset }
            },
        )
}

fn response() -> impl Strategy<Value = SyncResponse> {
    (
        any::<u64>(),
        num(),
        num(),
        num(),
        any::<bool>(),
        prop::collection::vec((num(), num(), num()), 0..50),
        prop::collection::vec(quota(), 0..10),
        prop::option::of((1u32..=64).prop_flat_map(|n| (0..n, Just(n)))),
        prop::option::of(num()),
        prop::option::of((any::<u64>(), any::<u64>())),
        prop::option::of(any::<u32>()),
        prop::collection::vec(
            (num(), any::<u32>(), num()).prop_map(|(id, share, lease_ns)| InFlightGrant {
                id,
                grant: Grant { share, lease_ns },
            }),
            0..5,
        ),
    )
        .prop_map(
            |(
                root_instance,
                acked_seq,
                version,
                epoch,
                more,
                counters,
                quotas,
                shard,
                root_epoch,
                key_secret,
                limiters,
                grants,
            )| {
                SyncResponse {
                    v: PROTOCOL_VERSION,
                    root_instance,
                    acked_seq,
                    version,
                    counters,
                    quotas,
                    epoch,
                    more,
                    shard: shard.map(|(index, count)| yarl_core::Shard { index, count }),
                    root_epoch,
                    key_secret,
                    limiters,
                    grants,
                }
            },
        )
}

fn in_flight_report() -> impl Strategy<Value = InFlightReport> {
    (num(), num(), [any::<u32>(); 5]).prop_map(|(id, seq, [a, b, c, d, e])| InFlightReport {
        id,
        report: Report { seq, held: a, held_total: b, in_flight: c, demand: d, refused: e },
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn requests_round_trip(r in request()) {
        let bytes = v2::encode_request(&r);
        prop_assert_eq!(v2::decode_request(&bytes, usize::MAX).unwrap(), r);
    }

    #[test]
    fn answers_round_trip(r in response()) {
        let bytes = v2::encode_response(&r);
        prop_assert_eq!(v2::decode_response(&bytes, usize::MAX).unwrap(), r);
    }

    /// What a limiter gets is the same whichever encoding the root answered in.
    #[test]
    fn v1_and_v2_answers_decode_alike(r in response()) {
        let json: SyncResponse = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        let bin = v2::decode_response(&v2::encode_response(&r), usize::MAX).unwrap();
        prop_assert_eq!(json, bin);
    }

    #[test]
    fn v1_and_v2_requests_decode_alike(r in request()) {
        let json: SyncRequest = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        let bin = v2::decode_request(&v2::encode_request(&r), usize::MAX).unwrap();
        prop_assert_eq!(json, bin);
    }

    /// Any prefix of a message is refused (never a panic, never a different message) but
    /// the one that ends where the fields appended for resets begin (absent fields are
    /// their defaults), and any byte string decodes or fails cleanly.
    #[test]
    fn truncated_and_random_bodies_fail_cleanly(
        r in request(),
        cut in any::<prop::sample::Index>(),
        junk in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let bytes = v2::encode_request(&r);
        let cut = cut.index(bytes.len());
        // What each earlier revision of the format would have carried of it.
        let mut no_drained = r.clone();
        no_drained.batches.iter_mut().for_each(|b| b.drained.clear());
        let mut no_age = no_drained.clone();
        no_age.view_age_ns = None;
        let mut no_reports = no_age.clone();
        no_reports.in_flight.clear();
        let mut no_hint = no_reports.clone();
        no_hint.hinted_seq = None;
        let mut no_keys = no_hint.clone();
        no_keys.key_templates.clear();
        let mut no_interest = no_keys.clone();
        no_interest.interest = false;
        no_interest.watch.clear();
        let mut plain = no_interest.clone();
        plain.seen_epoch = None;
        plain.batches.iter_mut().for_each(|b| b.epoch = None);
        let first_revision = v2::encode_request(&plain).len();
        match v2::decode_request(&bytes[..cut], usize::MAX) {
            Err(_) => {}
            // Cut where an earlier revision ended: exactly what that revision carried.
            Ok(got) => prop_assert!(
                (cut == first_revision && got == plain)
                    || (cut > first_revision && got == no_interest)
                    || (cut == v2::encode_request(&no_keys).len() && got == no_keys)
                    // Field 13 written makes field 12 written too, if empty.
                    || (cut >= v2::encode_request(&no_hint).len() && got == no_hint)
                    // Field 14 written makes 12 and 13 written too.
                    || (cut >= v2::encode_request(&no_reports).len() && got == no_reports)
                    // Field 15 written makes 12 to 14 written too.
                    || (cut >= v2::encode_request(&no_age).len() && got == no_age)
                    || (cut >= v2::encode_request(&no_drained).len() && got == no_drained)
            ),
        }
        let _ = v2::decode_request(&junk, 1_000);
        let _ = v2::decode_response(&junk, 1_000);
    }
}

fn sample_request() -> SyncRequest {
    SyncRequest {
        v: PROTOCOL_VERSION,
        limiter: "3f9c0a7d12e4b6c8000004d2".into(),
        root_instance: Some(8_156_402_117_731_558_001),
        since: 5123,
        epoch: 1042,
        batches: vec![
            DeltaBatch {
                seq: 17,
                deltas: vec![(12, 5000, 0), (40, 1000, 3000)],
                epoch: None,
                drained: Vec::new(),
            },
            DeltaBatch { seq: 18, deltas: vec![(12, 2000, 0)], epoch: None, drained: Vec::new() },
        ],
        hints: vec![(12, 48000)],
        seen_epoch: None,
        interest: false,
        watch: Vec::new(),
        key_templates: Vec::new(),
        hinted_seq: None,
        in_flight: Vec::new(),
        view_age_ns: None,
    }
}

/// The example of docs/sync-protocol.md, byte for byte.
#[test]
fn the_documented_example() {
    let bytes = v2::encode_request(&sample_request());
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex.join(" "),
        "02 18 33 66 39 63 30 61 37 64 31 32 65 34 62 36 63 38 30 30 30 30 30 34 64 32 \
         01 f1 c4 88 c5 af 90 d7 98 71 83 28 92 08 02 11 02 18 88 27 00 38 e8 07 b8 17 12 \
         01 18 d0 0f 00 01 18 80 f7 02"
    );
    let json = serde_json::to_vec(&sample_request()).unwrap();
    assert!(bytes.len() * 3 < json.len(), "{} vs {} bytes", bytes.len(), json.len());
}

#[test]
fn hostile_bodies_name_what_is_wrong() {
    let good = v2::encode_request(&sample_request());
    let err = |b: &[u8], max| v2::decode_request(b, max).unwrap_err();

    assert_eq!(err(&[], 10).to_string(), "bad v2 body at version: truncated");
    assert_eq!(err(&[1], 10), DecodeError::Version(1));
    assert_eq!(err(b"{\"v\":1}", 10), DecodeError::Version(b'{'));
    // since: a varint of eleven bytes overflows u64.
    let mut b = good[..36].to_vec();
    b.extend([0xff; 11]);
    assert_eq!(err(&b, 10).to_string(), "bad v2 body at since: varint longer than its type");
    // A list that declares more items than bytes follow.
    let mut b = good[..40].to_vec();
    b.extend([0xff, 0xff, 0xff, 0x7f]);
    assert_eq!(
        err(&b, 1 << 40).to_string(),
        "bad v2 body at batches: list longer than the rest of the body"
    );
    // The entry budget is checked before the entries are built.
    assert_eq!(err(&good, 3), DecodeError::TooLarge(4, 3));
    assert!(v2::decode_request(&good, 6).is_ok());
    // Cut inside a nested list.
    assert_eq!(err(&good[..50], 10).to_string(), "bad v2 body at batches[].deltas: truncated");
    // Fields appended for resets: the epoch held and one epoch per batch.
    let mut with = sample_request();
    with.seen_epoch = Some(1042);
    with.batches[0].epoch = Some(1040);
    with.batches[1].epoch = Some(1042);
    let bytes = v2::encode_request(&with);
    assert_eq!(&bytes[..good.len()], &good[..], "the first revision's fields are unchanged");
    assert_eq!(v2::decode_request(&bytes, 10).unwrap(), with);
    // Fields appended for answers by interest: the flag and the watched ids.
    let mut with_interest = with.clone();
    with_interest.interest = true;
    with_interest.watch = vec![7, 9, 1000];
    let bytes = v2::encode_request(&with_interest);
    assert_eq!(v2::decode_request(&bytes, 10).unwrap(), with_interest);
    // They count against the entry budget (4 deltas, 2 batches, 3 ids).
    assert_eq!(err(&bytes, 8), DecodeError::TooLarge(9, 8));
    // Field 12: the templates of keys named, against the budget as well (2 pairs).
    let mut with_keys = with_interest.clone();
    with_keys.key_templates = vec![(1 << 63 | 5, 3), (1 << 63 | 9, 4)];
    let bytes = v2::encode_request(&with_keys);
    assert_eq!(v2::decode_request(&bytes, 11).unwrap(), with_keys);
    assert_eq!(err(&bytes, 10), DecodeError::TooLarge(11, 10));
    // Field 13: the batches the hints hold.
    let mut with_hinted = with_keys.clone();
    with_hinted.hinted_seq = Some(17);
    let bytes = v2::encode_request(&with_hinted);
    assert_eq!(v2::decode_request(&bytes, 11).unwrap(), with_hinted);
    // Field 14: concurrency reports, against the budget as well (one).
    let mut with_reports = with_hinted.clone();
    let report = Report { seq: 3, held: 2, held_total: 4, in_flight: 5, demand: 6000, refused: 1 };
    with_reports.in_flight = vec![InFlightReport { id: 7, report }];
    let bytes = v2::encode_request(&with_reports);
    assert_eq!(v2::decode_request(&bytes, 12).unwrap(), with_reports);
    assert_eq!(err(&bytes, 11), DecodeError::TooLarge(12, 11));
    // Field 15: the age of the view the hints were read from.
    let mut with_age = with_reports.clone();
    with_age.view_age_ns = Some(1_500_000_000);
    let bytes = v2::encode_request(&with_age);
    assert_eq!(v2::decode_request(&bytes, 12).unwrap(), with_age);
    let mut b = bytes.clone();
    b.truncate(b.len() - 1);
    assert_eq!(err(&b, 12).to_string(), "bad v2 body at view_age_ns: truncated");
    // Field 16: per batch, what of each delta had drained (the second batch says nothing:
    // an empty list).
    let mut with_drained = with_age.clone();
    with_drained.batches[0].drained = vec![4000, 0];
    let bytes = v2::encode_request(&with_drained);
    assert_eq!(v2::decode_request(&bytes, 12).unwrap(), with_drained);
    let mut b = bytes.clone();
    b.truncate(b.len() - 1);
    assert_eq!(err(&b, 12).to_string(), "bad v2 body at batch_drained: truncated");
    // One amount for two deltas: refused by name.
    let mut one = with_drained.clone();
    one.batches[0].drained = vec![4000];
    let bytes = v2::encode_request(&one);
    assert_eq!(
        err(&bytes, 12).to_string(),
        "bad v2 body at batch_drained: neither empty nor one per delta"
    );
    // A huge declared length is refused before anything is allocated.
    let mut b = v2::encode_request(&with_age);
    b.extend([2, 0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert_eq!(
        err(&b, 12).to_string(),
        "bad v2 body at batch_drained: neither empty nor one per delta"
    );
    // Trailing bytes after every known field are left for later revisions.
    let mut b = v2::encode_request(&with_drained);
    b.extend([1, 2, 3]);
    assert_eq!(v2::decode_request(&b, 12).unwrap(), with_drained);
    // An epoch list that does not match the batches is refused, by name.
    let mut b = good.clone();
    b.extend([1, 5, 3, 0, 0, 0]);
    assert_eq!(err(&b, 10).to_string(), "bad v2 body at batch_epochs: not one per batch");
}

#[test]
fn answers_carry_reset_epochs_and_the_roots_epoch() {
    let q = |id: u64, reset_epoch: u64| QuotaUpdate {
        id,
        name: format!("q{id}"),
        epoch: id,
        deleted: false,
        limits: Limits::from_milli(1000, 1000, 2000).unwrap(),
        parent: None,
        reset_epoch,
    };
    let r = SyncResponse {
        v: PROTOCOL_VERSION,
        root_instance: 7,
        acked_seq: 3,
        version: 9,
        counters: vec![(1, 500, 0)],
        quotas: vec![q(1, 0), q(2, 2), q(3, 0)],
        epoch: 3,
        more: false,
        shard: None,
        root_epoch: Some(3),
        key_secret: None,
        limiters: None,
        grants: Vec::new(),
    };
    let bytes = v2::encode_response(&r);
    assert_eq!(v2::decode_response(&bytes, 100).unwrap(), r);
    // A reset naming a quota the answer does not carry is refused.
    let mut plain = r.clone();
    plain.root_epoch = None;
    plain.quotas[1].reset_epoch = 0;
    let mut b = v2::encode_response(&plain);
    b.extend([1, 3, 1, 7, 2]);
    assert_eq!(
        v2::decode_response(&b, 100).unwrap_err().to_string(),
        "bad v2 body at resets: index past the quotas"
    );
}

#[test]
fn a_live_quota_with_numbers_out_of_range_fails_the_answer_a_tombstone_does_not() {
    let answer = |deleted: bool| SyncResponse {
        v: PROTOCOL_VERSION,
        root_instance: 1,
        acked_seq: 0,
        version: 1,
        counters: Vec::new(),
        quotas: vec![QuotaUpdate {
            id: 1,
            name: "a".into(),
            epoch: 1,
            deleted,
            // 127 is one byte, 0x7f, found nowhere else in this body.
            limits: Limits::from_milli(127, 0, 0).unwrap(),
            parent: None,
            reset_epoch: 0,
        }],
        epoch: 1,
        more: false,
        shard: None,
        root_epoch: None,
        key_secret: None,
        limiters: None,
        grants: Vec::new(),
    };
    for deleted in [false, true] {
        let mut b = v2::encode_response(&answer(deleted));
        assert_eq!(b.iter().filter(|&&x| x == 0x7f).count(), 1);
        let at = b.iter().position(|&x| x == 0x7f).unwrap();
        b[at] = 0; // a limit of 0
        let got = v2::decode_response(&b, 100);
        if deleted {
            assert_eq!(
                got.unwrap().quotas[0].limits,
                Limits::NONE,
                "a tombstone's numbers mean nothing"
            );
        } else {
            assert_eq!(
                got.unwrap_err().to_string(),
                "bad v2 body at quotas: a quota's limit or bursts are out of range"
            );
        }
    }
}

/// An answer of `quotas` at epoch 3 and nothing else.
fn answer_of(quotas: Vec<QuotaUpdate>, limiters: Option<u32>) -> SyncResponse {
    SyncResponse {
        v: PROTOCOL_VERSION,
        root_instance: 1,
        acked_seq: 0,
        version: 1,
        counters: Vec::new(),
        quotas,
        epoch: 3,
        more: false,
        shard: None,
        root_epoch: None,
        key_secret: None,
        limiters,
        grants: Vec::new(),
    }
}

#[test]
fn quotas_in_shadow_mode_travel_in_an_appended_field_old_limiters_skip() {
    let q = |id: u64, dry: bool| QuotaUpdate {
        id,
        name: format!("q{id}"),
        epoch: id,
        deleted: false,
        limits: Limits::from_milli(1000, 0, 0).unwrap().with_dry_run(dry),
        parent: None,
        reset_epoch: 0,
    };
    let mut answer = answer_of(vec![q(1, false), q(2, true), q(3, false)], None);
    let b = v2::encode_response(&answer);
    let got = v2::decode_response(&b, 100).unwrap();
    assert_eq!(got, answer);
    assert!(got.quotas[1].limits.dry_run() && !got.quotas[0].limits.dry_run());
    // The same answer with nobody in shadow mode ends before field 14, byte for byte what a
    // root that predates it sent; an old limiter reading the new body stops after field 13.
    answer.quotas[1].limits = answer.quotas[1].limits.with_dry_run(false);
    let plain = v2::encode_response(&answer);
    assert!(plain.len() < b.len());
    // An index past the quotas is refused.
    let mut bad = b.clone();
    *bad.last_mut().unwrap() = 9;
    assert_eq!(
        v2::decode_response(&bad, 100).unwrap_err().to_string(),
        "bad v2 body at shadow: index past the quotas"
    );
    // v1 JSON carries it as a field of the quota.
    let json = serde_json::to_string(&got.quotas[1]).unwrap();
    assert!(json.contains("\"dry_run\":true"), "{json}");
    assert!(!serde_json::to_string(&got.quotas[0]).unwrap().contains("dry_run"));
}

#[test]
fn max_in_flight_travels_in_an_appended_field_old_limiters_skip() {
    let q = |id: u64, in_flight: u32| QuotaUpdate {
        id,
        name: format!("q{id}"),
        epoch: id,
        deleted: false,
        limits: Limits::in_flight_only(50).unwrap().with_max_in_flight(in_flight).unwrap(),
        parent: None,
        reset_epoch: 0,
    };
    let mut answer = answer_of(vec![q(1, 0), q(2, 50), q(3, 1_000_000)], Some(2));
    let b = v2::encode_response(&answer);
    let got = v2::decode_response(&b, 100).unwrap();
    assert_eq!(got, answer);
    assert_eq!(
        got.quotas.iter().map(|q| q.limits.max_in_flight()).collect::<Vec<_>>(),
        [0, 50, 1_000_000]
    );
    // Field 14 is written (empty) before it; without one, the answer ends before both.
    for q in &mut answer.quotas {
        q.limits = q.limits.with_max_in_flight(0).unwrap();
    }
    let plain = v2::encode_response(&answer);
    assert_eq!(&b[..plain.len()], &plain[..], "the fields before are the same bytes");
    assert_eq!(&b[plain.len()..], &[0, 2, 1, 50, 2, 0xc0, 0x84, 0x3d], "14 empty, then 15");
    // A reader that predates field 15 stops at 14: what it decodes is the same but the caps.
    let old = v2::decode_response(&b[..plain.len() + 1], 100).unwrap();
    assert_eq!(old, answer);
    // Bad values are refused, naming the field.
    let mut over = b.clone();
    over.truncate(plain.len() + 5);
    over.extend([0xc1, 0x84, 0x3d]); // 1,000,001
    assert_eq!(
        v2::decode_response(&over, 100).unwrap_err().to_string(),
        "bad v2 body at max_in_flight: above 1000000"
    );
    let mut past = b.clone();
    past[plain.len() + 4] = 7;
    assert_eq!(
        v2::decode_response(&past, 100).unwrap_err().to_string(),
        "bad v2 body at max_in_flight: index past the quotas"
    );
    // v1 JSON carries it as a field of the quota.
    let json = serde_json::to_string(&got.quotas[1]).unwrap();
    assert!(json.contains("\"max_in_flight\":50"), "{json}");
    assert!(!serde_json::to_string(&got.quotas[0]).unwrap().contains("max_in_flight"));
}

/// A concurrency report and grant are flat objects in JSON, as they were with
/// `#[serde(flatten)]`; an unknown field (however deep) is skipped, not buffered.
#[test]
fn in_flight_reports_are_flat_json_and_skip_unknown_fields() {
    let report = InFlightReport {
        id: 7,
        report: Report { seq: 2, held: 3, held_total: 4, in_flight: 5, demand: 6, refused: 1 },
    };
    assert_eq!(
        serde_json::to_string(&report).unwrap(),
        r#"{"id":7,"seq":2,"held":3,"held_total":4,"in_flight":5,"demand":6,"refused":1}"#
    );
    let deep = r#"{"id":7,"x":{"a":{"b":[1,2,{"c":null}]}},"seq":2,"held":3,"held_total":4,"in_flight":5,"demand":6,"refused":1}"#;
    assert_eq!(serde_json::from_str::<InFlightReport>(deep).unwrap(), report);
    assert!(serde_json::from_str::<InFlightReport>(r#"{"id":7,"seq":2}"#).is_err());
    let grant = InFlightGrant { id: 9, grant: Grant { share: 4, lease_ns: 5_000 } };
    assert_eq!(serde_json::to_string(&grant).unwrap(), r#"{"id":9,"share":4,"lease_ns":5000}"#);
    assert_eq!(
        serde_json::from_str::<InFlightGrant>(r#"{"id":9,"share":4,"lease_ns":5000,"z":[]}"#)
            .unwrap(),
        grant
    );
}

/// An empty batch is 2 bytes of v2 and 72 in memory: more than a limiter keeps are refused
/// before the list is allocated.
#[test]
fn more_batches_than_a_limiter_keeps_are_refused() {
    let batch = |seq| DeltaBatch { seq, deltas: Vec::new(), epoch: None, drained: Vec::new() };
    let mut r = sample_request();
    r.batches = (1..=yarl_core::proto::MAX_BATCHES as u64).map(batch).collect();
    assert!(v2::decode_request(&v2::encode_request(&r), 1_000_000).is_ok());
    r.batches.push(batch(5_000));
    let err = v2::decode_request(&v2::encode_request(&r), 1_000_000).unwrap_err();
    assert!(matches!(err, DecodeError::Malformed { field: "batches", .. }), "{err:?}");
}
