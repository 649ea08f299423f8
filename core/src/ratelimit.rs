//! The IETF `RateLimit-Policy` and `RateLimit` header fields
//! (draft-ietf-httpapi-ratelimit-headers-11) for a chain of leaky buckets.
//!
//! # How a leaky bucket maps to `q`, `w`, `r`, `t`
//!
//! A request passes for sure while the fill `F` is at or below `low_burst`; above it, it
//! may be dropped. So the fields promise only what passes for sure:
//!
//! * `q = floor(low_burst) + 1`: units that pass at once from an empty bucket, sent one unit
//!   at a time (the last one may take the fill just past `low_burst`);
//! * `w = ceil(q × window / limit)` seconds, at least 1: the bucket drains `q` units in that
//!   time, so `q` per `w` is the quota's rate (`q=5000;w=3600` for 5,000 per hour with its
//!   default bursts);
//! * `r = floor(low_burst - F) + 1` while `F <= low_burst`, else 0: what still passes for
//!   sure now (0 for the level that rejected the request, whatever its fill);
//! * `t = 0` while `r > 0`; otherwise the whole seconds (at least 1) until `F` drains to
//!   `low_burst`, the same figure as `Retry-After` (on a rejection, `Retry-After` itself).
//!
//! Every figure derives from one estimate of the fill at one instant, so `r` and `t` can
//! never contradict each other or the decision, and under steady load they only move when
//! the fill crosses a whole unit or a whole second of drain. One item per level of the
//! chain the request was decided on, the quota first and its ancestors after, each named by
//! its quota (a structured-field String; quota names need no escaping: a key's bytes outside
//! the name set are `%XX`). Units are the quota's own (requests, bytes, …): `qu` is not sent.
//!
//! # Keys: the policy is the template, `pk` the key
//!
//! A key under a template is one partition of one policy, which is what the draft's `pk`
//! parameter (a Byte Sequence) is for: its item is named by the template (`"api_key_*"`)
//! with `pk` set to the key's 8-byte wire id. That id is a keyed hash of the name with the
//! cluster's secret, so it is the same on every host and says nothing of the key itself (an
//! API key sent back in a header could end up in logs and caches the key itself never
//! reaches).

/// One level of a chain at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    /// The quota's name.
    pub name: String,
    /// Units per window.
    pub limit: f64,
    /// The window, seconds (1 for a per-second quota).
    pub window: u64,
    /// Units.
    pub low_burst: f64,
    /// Units.
    pub high_burst: f64,
    /// Estimated fill, units.
    pub fill: f64,
    /// For a key under a template: the template's name and the key's wire id, sent as the
    /// item's policy and `pk`.
    pub partition: Option<Partition>,
}

/// The template and key of a [`Level`] that is a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// The template's name, `*` included.
    pub template: String,
    /// The key's wire id.
    pub key: u64,
}

impl Level {
    /// `q`.
    pub fn quota(&self) -> u64 {
        floor_units(self.low_burst).saturating_add(1)
    }

    /// Units per second.
    fn per_sec(&self) -> f64 {
        self.limit / self.window.max(1) as f64
    }

    /// `w`, seconds.
    pub fn window(&self) -> u64 {
        // `q · window / limit`, multiplied first: a quota of 5,000 per hour whose `q` is
        // 5,000 has a `w` of 3,600, not 3,601 from a rounded per-second rate.
        let w = (self.quota() as f64 * self.window.max(1) as f64 / self.limit.max(1e-9)).ceil();
        if w.is_finite() && w >= 1.0 {
            w.min(u32::MAX as f64) as u64
        } else {
            1
        }
    }

    /// `r`.
    pub fn remaining(&self) -> u64 {
        if self.fill <= self.low_burst {
            floor_units(self.low_burst - self.fill).saturating_add(1)
        } else {
            0
        }
    }

    /// `t`: 0 while something remains, else seconds until the fill is back at `low_burst`.
    pub fn reset(&self) -> u64 {
        if self.remaining() > 0 {
            return 0;
        }
        let s = ((self.fill - self.low_burst) / self.per_sec().max(1e-12)).ceil();
        if s.is_finite() && s >= 1.0 {
            s.min(u32::MAX as f64) as u64
        } else {
            1
        }
    }
}

fn floor_units(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        x.floor().min(u64::MAX as f64) as u64
    } else {
        0
    }
}

/// The two field values for `levels` (the decided quota first). `rejected`: the index of
/// the level that rejected the request and the `Retry-After` sent with it.
pub fn fields(levels: &[Level], rejected: Option<(usize, u32)>) -> Option<(String, String)> {
    if levels.is_empty() {
        return None;
    }
    let mut policy = String::with_capacity(levels.len() * 40);
    let mut state = String::with_capacity(levels.len() * 32);
    for (i, l) in levels.iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
            state.push_str(", ");
        }
        let (r, t) = match rejected {
            Some((k, retry)) if k == i => (0, u64::from(retry.max(1))),
            _ => (l.remaining(), l.reset()),
        };
        let (id, pk) = match &l.partition {
            Some(p) => (p.template.as_str(), format!(";pk=:{}:", base64(&p.key.to_be_bytes()))),
            None => (l.name.as_str(), String::new()),
        };
        policy.push_str(&format!("\"{id}\";q={};w={}{pk}", l.quota(), l.window()));
        state.push_str(&format!("\"{id}\";r={r};t={t}{pk}"));
    }
    Some((policy, state))
}

/// Items of the same two fields for concurrency caps (the draft's `qu="concurrent-requests"`):
/// each level's cluster-wide `max_in_flight` as `q`, no window, and as `r` what this host can
/// still admit on it now; a level that `refused` the request has `r=0;t=1` (it was refused
/// with `Retry-After: 1`). `None` when there is no level. Appended to the rates' items.
pub fn concurrency_fields(levels: &[crate::SlotLevel], refused: bool) -> Option<(String, String)> {
    if levels.is_empty() {
        return None;
    }
    let mut policy = String::with_capacity(levels.len() * 48);
    let mut state = String::with_capacity(levels.len() * 24);
    for (i, l) in levels.iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
            state.push_str(", ");
        }
        // A key's level is its template's policy, partitioned by the key (as for rates).
        let pk = l.key.map_or(String::new(), |k| format!(";pk=:{}:", base64(&k.to_be_bytes())));
        policy.push_str(&format!("\"{}\";q={};qu=\"concurrent-requests\"{pk}", l.name, l.cap));
        if refused {
            state.push_str(&format!("\"{}\";r=0;t=1{pk}", l.name));
        } else {
            state.push_str(&format!("\"{}\";r={}{pk}", l.name, l.remaining));
        }
    }
    Some((policy, state))
}

/// Standard base64 with padding (RFC 4648 §4), as a structured-field Byte Sequence wants.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(name: &str, limit: f64, low: f64, high: f64, fill: f64) -> Level {
        Level {
            name: name.into(),
            limit,
            window: 1,
            low_burst: low,
            high_burst: high,
            fill,
            partition: None,
        }
    }

    #[test]
    fn base64_is_rfc_4648s() {
        // RFC 4648 §10's test vectors.
        let v = [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg==")];
        for (raw, enc) in v {
            assert_eq!(base64(raw.as_bytes()), enc);
        }
        assert_eq!(base64(b"fooba"), "Zm9vYmE=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn a_key_is_its_templates_policy_with_its_id_as_pk() {
        let key = Level {
            partition: Some(Partition { template: "api_key_*".into(), key: 0x8000_0000_0000_0001 }),
            ..level("api_key_%00x", 10.0, 15.0, 30.0, 0.0)
        };
        let chain = [key, level("api_all", 1000.0, 1500.0, 3000.0, 10.0)];
        let (p, s) = fields(&chain, Some((0, 2))).unwrap();
        assert_eq!(p, "\"api_key_*\";q=16;w=2;pk=:gAAAAAAAAAE=:, \"api_all\";q=1501;w=2");
        assert_eq!(s, "\"api_key_*\";r=0;t=2;pk=:gAAAAAAAAAE=:, \"api_all\";r=1491;t=0");
    }

    #[test]
    fn a_bucket_maps_to_q_w_r_t() {
        // 100/s with the recommended bursts at a 1 s interval.
        let empty = level("api", 100.0, 150.0, 300.0, 0.0);
        assert_eq!(
            (empty.quota(), empty.window(), empty.remaining(), empty.reset()),
            (151, 2, 151, 0)
        );
        let half = level("api", 100.0, 150.0, 300.0, 75.5);
        assert_eq!((half.remaining(), half.reset()), (75, 0));
        let at_low = level("api", 100.0, 150.0, 300.0, 150.0);
        assert_eq!((at_low.remaining(), at_low.reset()), (1, 0), "F = low still passes one");
        let over = level("api", 100.0, 150.0, 300.0, 150.001);
        assert_eq!((over.remaining(), over.reset()), (0, 1));
        let far = level("api", 100.0, 150.0, 300.0, 420.0);
        assert_eq!(far.reset(), 3, "(420 - 150) / 100 rounded up");
        // A hard cutoff at 0: one request at a time.
        let cut = level("one", 1.0, 0.0, 0.0, 0.0);
        assert_eq!((cut.quota(), cut.window(), cut.remaining()), (1, 1, 1));
        assert_eq!(
            (
                level("one", 1.0, 0.0, 0.0, 0.5).remaining(),
                level("one", 1.0, 0.0, 0.0, 0.5).reset()
            ),
            (0, 1)
        );
        // Slow quotas have long windows; tiny or broken numbers stay sane.
        assert_eq!(level("slow", 0.001, 10.0, 10.0, 0.0).window(), 11_000);
        assert_eq!(level("x", 1e12, 0.0, 0.0, f64::NAN).reset(), 1);
    }

    #[test]
    fn fields_list_every_level_and_the_rejecting_one_has_nothing_left() {
        let chain = [
            level("s3_photos_read", 5.0, 5.0, 10.0, 2.2),
            level("s3_photos", 20.0, 10.0, 20.0, 14.0),
        ];
        let (p, s) = fields(&chain, None).unwrap();
        assert_eq!(p, "\"s3_photos_read\";q=6;w=2, \"s3_photos\";q=11;w=1");
        assert_eq!(s, "\"s3_photos_read\";r=3;t=0, \"s3_photos\";r=0;t=1");
        let (_, s) = fields(&chain, Some((1, 4))).unwrap();
        assert_eq!(s, "\"s3_photos_read\";r=3;t=0, \"s3_photos\";r=0;t=4", "t is Retry-After");
        // The local guard can reject below low_burst: r must not promise anything there.
        let (_, s) = fields(&chain[..1], Some((0, 1))).unwrap();
        assert_eq!(s, "\"s3_photos_read\";r=0;t=1");
        assert_eq!(fields(&[], None), None);
    }

    #[test]
    fn concurrency_items_give_the_cap_and_what_this_host_can_still_admit() {
        let up = |name: &str, cap, remaining| crate::SlotLevel {
            name: name.into(),
            cap,
            remaining,
            key: None,
        };
        let (p, s) = concurrency_fields(&[up("uploads", 50, 3), up("db", 500, 0)], false).unwrap();
        assert_eq!(
            p,
            "\"uploads\";q=50;qu=\"concurrent-requests\", \"db\";q=500;qu=\"concurrent-requests\""
        );
        assert_eq!(s, "\"uploads\";r=3, \"db\";r=0");
        let (_, s) = concurrency_fields(&[up("uploads", 50, 7)], true).unwrap();
        assert_eq!(s, "\"uploads\";r=0;t=1", "refused: nothing left, try in a second");
        assert_eq!(concurrency_fields(&[], false), None);
        // A key's level: its template's policy, partitioned by the key's wire id.
        let key = crate::SlotLevel { key: Some(0x8000_0000_0000_0001), ..up("gen_*", 8, 2) };
        let (p, s) = concurrency_fields(&[key], false).unwrap();
        assert_eq!(p, "\"gen_*\";q=8;qu=\"concurrent-requests\";pk=:gAAAAAAAAAE=:");
        assert_eq!(s, "\"gen_*\";r=2;pk=:gAAAAAAAAAE=:");
    }
}
