//! The bounded decoder of protocol v2 (see "Hostile input" in the parent module).

use super::{DecodeError, WIRE_VERSION};
use crate::concurrency::{Grant, Report};
use crate::proto::{
    DeltaBatch, InFlightGrant, InFlightReport, SyncRequest, SyncResponse, MAX_LIMITER_ID_LEN,
    PROTOCOL_VERSION,
};
use crate::quota::{Limits, QuotaUpdate};
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde::Deserializer;
use std::cell::Cell;
use std::fmt;

/// What the decoder knows while serde drives it: where it is, and how many entries it may
/// still allocate. postcard's own errors carry no position, so ours are built from this.
struct Ctx {
    field: Cell<&'static str>,
    budget: Cell<usize>,
    max: usize,
    used: Cell<usize>,
    error: Cell<Option<DecodeError>>,
}

impl Ctx {
    fn new(max: usize) -> Self {
        Ctx {
            field: Cell::new("version"),
            budget: Cell::new(max),
            max,
            used: Cell::new(0),
            error: Cell::new(None),
        }
    }

    fn at(&self, f: &'static str) {
        self.field.set(f);
    }

    fn fail<E: de::Error>(&self, e: DecodeError) -> E {
        self.error.set(Some(e));
        E::custom("v2")
    }

    fn malformed<E: de::Error>(&self, why: &'static str) -> E {
        self.fail(DecodeError::Malformed { field: self.field.get(), why })
    }

    /// Reserves `n` entries of the budget for the list starting here (`None`: it declares
    /// more items than bytes are left).
    fn reserve<E: de::Error>(&self, n: Option<usize>, count: bool) -> Result<usize, E> {
        let n = n.ok_or_else(|| self.malformed("list longer than the rest of the body"))?;
        if count {
            let used = self.used.get().saturating_add(n);
            self.used.set(used);
            if n > self.budget.get() {
                return Err(self.fail(DecodeError::TooLarge(used, self.max)));
            }
            self.budget.set(self.budget.get() - n);
        }
        Ok(n)
    }

    /// Reserves a list of `n` items for a field appended after the first revision (read
    /// outside serde from the `rest` bytes that follow its length), each item at least
    /// `min_bytes` long: the entries of the whole body stay within the budget.
    fn reserve_tail(
        &self,
        field: &'static str,
        n: u64,
        min_bytes: u64,
        rest: usize,
    ) -> Result<usize, DecodeError> {
        let used = self.used.get().saturating_add(usize::try_from(n).unwrap_or(usize::MAX));
        if n.saturating_mul(min_bytes) > rest as u64 {
            return Err(malformed(field, "list longer than the rest of the body"));
        }
        if used > self.max {
            return Err(DecodeError::TooLarge(used, self.max));
        }
        self.used.set(used);
        Ok(n as usize)
    }

    fn finish(&self, e: postcard::Error) -> DecodeError {
        if let Some(e) = self.error.take() {
            return e;
        }
        let why = match e {
            postcard::Error::DeserializeUnexpectedEnd => "truncated",
            postcard::Error::DeserializeBadVarint => "varint longer than its type",
            postcard::Error::DeserializeBadBool => "bool is neither 0 nor 1",
            postcard::Error::DeserializeBadUtf8 => "string is not UTF-8",
            postcard::Error::DeserializeBadOption => "option tag is neither 0 nor 1",
            _ => "not a v2 message",
        };
        DecodeError::Malformed { field: self.field.get(), why }
    }
}

fn next<'de, A: SeqAccess<'de>, S: DeserializeSeed<'de>>(
    ctx: &Ctx,
    seq: &mut A,
    field: &'static str,
    seed: S,
) -> Result<S::Value, A::Error> {
    ctx.at(field);
    let v = seq.next_element_seed(seed)?;
    // The field may have moved on inside a nested list: point back at this one.
    ctx.at(field);
    v.ok_or_else(|| ctx.malformed("truncated"))
}

fn version<'de, A: SeqAccess<'de>>(ctx: &Ctx, seq: &mut A) -> Result<(), A::Error> {
    let v: u8 = next(ctx, seq, "version", plain())?;
    if v != WIRE_VERSION {
        return Err(ctx.fail(DecodeError::Version(v)));
    }
    Ok(())
}

fn plain<T>() -> std::marker::PhantomData<T> {
    std::marker::PhantomData
}

/// A list of wire items `W`, each turned into a `T` as it is read (ids restored from
/// their differences by `map`), within the entry budget.
struct Bounded<'c, W, F> {
    ctx: &'c Ctx,
    field: &'static str,
    /// Whether the items count against the entry budget.
    count: bool,
    map: F,
    _w: std::marker::PhantomData<W>,
}

impl<'c, W, F> Bounded<'c, W, F> {
    fn new(ctx: &'c Ctx, field: &'static str, count: bool, map: F) -> Self {
        Bounded { ctx, field, count, map, _w: std::marker::PhantomData }
    }
}

impl<'de, W, T, F> DeserializeSeed<'de> for Bounded<'_, W, F>
where
    W: de::Deserialize<'de>,
    F: FnMut(W) -> T,
{
    type Value = Vec<T>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<T>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, W, T, F> Visitor<'de> for Bounded<'_, W, F>
where
    W: de::Deserialize<'de>,
    F: FnMut(W) -> T,
{
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the list {}", self.field)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let ctx = self.ctx;
        ctx.at(self.field);
        let n = ctx.reserve(seq.size_hint(), self.count)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let w = next(ctx, &mut seq, self.field, plain::<W>())?;
            out.push((self.map)(w));
        }
        Ok(out)
    }
}

/// The `batches` list: each batch is `seq` and a nested list of deltas.
struct BatchList<'c>(&'c Ctx);

impl<'de> DeserializeSeed<'de> for BatchList<'_> {
    type Value = Vec<DeltaBatch>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<DeltaBatch>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for BatchList<'_> {
    type Value = Vec<DeltaBatch>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the list batches")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<DeltaBatch>, A::Error> {
        let ctx = self.0;
        ctx.at("batches");
        let n = ctx.reserve(seq.size_hint(), true)?;
        // Each is 72 bytes decoded and may be 2 on the wire: checked before the list is
        // allocated, as the budget of entries assumes 24 bytes each.
        if n > crate::proto::MAX_BATCHES {
            return Err(ctx.malformed("more batches than a limiter keeps (1,024)"));
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(next(ctx, &mut seq, "batches", OneBatch(ctx))?);
        }
        Ok(out)
    }
}

struct OneBatch<'c>(&'c Ctx);

impl<'de> DeserializeSeed<'de> for OneBatch<'_> {
    type Value = DeltaBatch;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<DeltaBatch, D::Error> {
        d.deserialize_tuple(2, self)
    }
}

impl<'de> Visitor<'de> for OneBatch<'_> {
    type Value = DeltaBatch;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a batch")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<DeltaBatch, A::Error> {
        let ctx = self.0;
        let seq_no: u64 = next(ctx, &mut seq, "batches[].seq", plain())?;
        let mut id = 0u64;
        let deltas = next(
            ctx,
            &mut seq,
            "batches[].deltas",
            Bounded::new(ctx, "batches[].deltas", true, |(d, a, r): (i64, u64, u64)| {
                id = id.wrapping_add(d as u64);
                (id, a, r)
            }),
        )?;
        // Field 9 of the request, read by `decode_request` when present.
        Ok(DeltaBatch { seq: seq_no, deltas, epoch: None, drained: Vec::new() })
    }
}

type QuotaWire = (i64, String, i64, bool, u64, u64, u64, Option<String>);

/// A whole message: `R` says which.
struct Message<'c, R>(&'c Ctx, std::marker::PhantomData<R>);

impl<'de> DeserializeSeed<'de> for Message<'_, SyncRequest> {
    type Value = SyncRequest;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<SyncRequest, D::Error> {
        d.deserialize_tuple(7, self)
    }
}

impl<'de> Visitor<'de> for Message<'_, SyncRequest> {
    type Value = SyncRequest;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a v2 sync request")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SyncRequest, A::Error> {
        let ctx = self.0;
        version(ctx, &mut seq)?;
        let limiter: &str = next(ctx, &mut seq, "limiter", plain())?;
        if limiter.is_empty() || limiter.len() > MAX_LIMITER_ID_LEN {
            return Err(ctx.malformed("limiter id must be 1 to 128 bytes"));
        }
        let root_instance = next(ctx, &mut seq, "root_instance", plain())?;
        let since = next(ctx, &mut seq, "since", plain())?;
        let epoch = next(ctx, &mut seq, "epoch", plain())?;
        let batches = next(ctx, &mut seq, "batches", BatchList(ctx))?;
        let mut id = 0u64;
        let hints = next(
            ctx,
            &mut seq,
            "hints",
            Bounded::new(ctx, "hints", true, |(d, f): (i64, u64)| {
                id = id.wrapping_add(d as u64);
                (id, f)
            }),
        )?;
        Ok(SyncRequest {
            v: PROTOCOL_VERSION,
            limiter: limiter.to_owned(),
            root_instance,
            since,
            epoch,
            batches,
            hints,
            // Fields 8 to 12, read by `decode_request` when present.
            seen_epoch: None,
            key_templates: Vec::new(),
            hinted_seq: None,
            interest: false,
            watch: Vec::new(),
            in_flight: Vec::new(),
            view_age_ns: None,
        })
    }
}

impl<'de> DeserializeSeed<'de> for Message<'_, SyncResponse> {
    type Value = SyncResponse;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<SyncResponse, D::Error> {
        d.deserialize_tuple(8, self)
    }
}

impl<'de> Visitor<'de> for Message<'_, SyncResponse> {
    type Value = SyncResponse;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a v2 sync answer")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SyncResponse, A::Error> {
        let ctx = self.0;
        version(ctx, &mut seq)?;
        let root_instance = next(ctx, &mut seq, "root_instance", plain())?;
        let acked_seq = next(ctx, &mut seq, "acked_seq", plain())?;
        let version_ = next(ctx, &mut seq, "version", plain())?;
        let epoch = next(ctx, &mut seq, "epoch", plain())?;
        let more = next(ctx, &mut seq, "more", plain())?;
        let mut id = 0u64;
        let counters = next(
            ctx,
            &mut seq,
            "counters",
            Bounded::new(ctx, "counters", true, |(d, f, m): (i64, u64, u64)| {
                id = id.wrapping_add(d as u64);
                (id, f, m)
            }),
        )?;
        let (mut id, mut ep) = (0u64, 0u64);
        let mut bad_limits = false;
        let quotas = next(
            ctx,
            &mut seq,
            "quotas",
            Bounded::new(ctx, "quotas", true, |q: QuotaWire| {
                id = id.wrapping_add(q.0 as u64);
                ep = ep.wrapping_add(q.2 as u64);
                // A tombstone's numbers mean nothing; a live quota's must be valid.
                let limits = Limits::from_rate_word(q.4, q.5, q.6).unwrap_or_else(|_| {
                    bad_limits |= !q.3;
                    Limits::NONE
                });
                QuotaUpdate {
                    id,
                    name: q.1,
                    epoch: ep,
                    deleted: q.3,
                    limits,
                    parent: q.7,
                    // Field 11, read by `decode_response` when present.
                    reset_epoch: 0,
                }
            }),
        )?;
        if bad_limits {
            return Err(ctx.malformed("a quota's limit or bursts are out of range"));
        }
        Ok(SyncResponse {
            v: PROTOCOL_VERSION,
            root_instance,
            acked_seq,
            version: version_,
            counters,
            quotas,
            epoch,
            more,
            // Fields 9 to 12, read by `decode_response` when present.
            shard: None,
            root_epoch: None,
            key_secret: None,
            limiters: None,
            grants: Vec::new(),
        })
    }
}

/// Decodes a request with at most `max_entries` deltas + hints + batches.
pub(super) fn decode_request(body: &[u8], max_entries: usize) -> Result<SyncRequest, DecodeError> {
    let ctx = Ctx::new(max_entries);
    let mut d = postcard::Deserializer::from_bytes(body);
    let mut r = Message(&ctx, std::marker::PhantomData::<SyncRequest>)
        .deserialize(&mut d)
        .map_err(|e| ctx.finish(e))?;
    // Fields appended after the first revision: absent means their default.
    let rest = d.finalize().unwrap_or(&[]);
    if !rest.is_empty() {
        let (seen, rest) = take::<Option<u64>>(rest, "seen_epoch", "not an option of a varint")?;
        r.seen_epoch = seen;
        let (n, mut rest) = take::<u64>(rest, "batch_epochs", "not a list")?;
        if n != r.batches.len() as u64 {
            return Err(malformed("batch_epochs", "not one per batch"));
        }
        for b in &mut r.batches {
            let (e, more) = take::<Option<u64>>(rest, "batch_epochs", "not an option of a varint")?;
            b.epoch = e;
            rest = more;
        }
        if !rest.is_empty() {
            let (interest, more) = take::<bool>(rest, "interest", "bool is neither 0 nor 1")?;
            r.interest = interest;
            let (n, mut more) = take::<u64>(more, "watch", "not a list")?;
            // Each id takes a byte at least.
            let n = ctx.reserve_tail("watch", n, 1, more.len())?;
            let mut watch = Vec::with_capacity(n);
            let mut id = 0u64;
            for _ in 0..n {
                let (d, after) = take::<i64>(more, "watch", "not a varint")?;
                id = id.wrapping_add(d as u64);
                watch.push(id);
                more = after;
            }
            r.watch = watch;
            if !more.is_empty() {
                let (keys, more) = key_templates(&ctx, more)?;
                r.key_templates = keys;
                if !more.is_empty() {
                    let (hinted, more) =
                        take::<Option<u64>>(more, "hinted_seq", "not an option of a varint")?;
                    r.hinted_seq = hinted;
                    if !more.is_empty() {
                        let (reports, more) = in_flight_reports(&ctx, more)?;
                        r.in_flight = reports;
                        if !more.is_empty() {
                            let (age, more) = take::<Option<u64>>(
                                more,
                                "view_age_ns",
                                "not an option of a varint",
                            )?;
                            r.view_age_ns = age;
                            if !more.is_empty() {
                                drained(&mut r.batches, more)?;
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(r)
}

/// Field 16 of a request: per batch, its `drained` amounts, none or one per delta (checked
/// before they are allocated, so they take no more than the deltas did).
fn drained<'a>(batches: &mut [DeltaBatch], bytes: &'a [u8]) -> Result<&'a [u8], DecodeError> {
    let (n, mut more) = take::<u64>(bytes, "batch_drained", "not a list")?;
    if n != batches.len() as u64 {
        return Err(malformed("batch_drained", "not one per batch"));
    }
    for b in batches {
        let (k, after) = take::<u64>(more, "batch_drained", "not a list")?;
        if k != 0 && k != b.deltas.len() as u64 {
            return Err(malformed("batch_drained", "neither empty nor one per delta"));
        }
        // Each amount takes a byte at least.
        if k > after.len() as u64 {
            return Err(malformed("batch_drained", "truncated"));
        }
        more = after;
        let mut out = Vec::with_capacity(k as usize);
        for _ in 0..k {
            let (v, after) = take::<u64>(more, "batch_drained", "not a varint")?;
            out.push(v);
            more = after;
        }
        b.drained = out;
    }
    Ok(more)
}

/// Field 12 of a request: (key id delta, template id) pairs, as bounded as the rest.
/// Key ids with their template ids, and the bytes after them.
type KeysAndRest<'a> = (Vec<(u64, u64)>, &'a [u8]);

fn key_templates<'a>(ctx: &Ctx, bytes: &'a [u8]) -> Result<KeysAndRest<'a>, DecodeError> {
    let (n, mut more) = take::<u64>(bytes, "key_templates", "not a list")?;
    // Each pair takes two bytes at least.
    let n = ctx.reserve_tail("key_templates", n, 2, more.len())?;
    let mut out = Vec::with_capacity(n);
    let mut id = 0u64;
    for _ in 0..n {
        let ((d, t), after) = take::<(i64, u64)>(more, "key_templates", "not a pair of varints")?;
        id = id.wrapping_add(d as u64);
        out.push((id, t));
        more = after;
    }
    Ok((out, more))
}

fn malformed(field: &'static str, why: &'static str) -> DecodeError {
    DecodeError::Malformed { field, why }
}

/// One appended field of type `T` from `bytes`, and the bytes after it.
fn take<'a, T: de::Deserialize<'a>>(
    bytes: &'a [u8],
    field: &'static str,
    what: &'static str,
) -> Result<(T, &'a [u8]), DecodeError> {
    postcard::take_from_bytes::<T>(bytes).map_err(|e| {
        malformed(
            field,
            if matches!(e, postcard::Error::DeserializeUnexpectedEnd) { "truncated" } else { what },
        )
    })
}

/// Field 14: the indexes of the answer's quotas in shadow mode; the bytes after it.
fn shadow_mode<'a>(r: &mut SyncResponse, rest: &'a [u8]) -> Result<&'a [u8], DecodeError> {
    let (n, mut rest) = take::<u64>(rest, "shadow", "not a list")?;
    if n > r.quotas.len() as u64 {
        return Err(malformed("shadow", "more than the quotas"));
    }
    for _ in 0..n {
        let (i, more) = take::<u32>(rest, "shadow", "not a varint")?;
        let q = r
            .quotas
            .get_mut(i as usize)
            .ok_or_else(|| malformed("shadow", "index past the quotas"))?;
        q.limits = q.limits.with_dry_run(true);
        rest = more;
    }
    Ok(rest)
}

/// Concurrency reports, and the bytes after them.
type ReportsAndRest<'a> = (Vec<InFlightReport>, &'a [u8]);

/// Field 14 of a request: one concurrency report per counter, as bounded as the rest.
fn in_flight_reports<'a>(ctx: &Ctx, bytes: &'a [u8]) -> Result<ReportsAndRest<'a>, DecodeError> {
    let (n, mut more) = take::<u64>(bytes, "in_flight", "not a list")?;
    // Each report takes seven bytes at least.
    let n = ctx.reserve_tail("in_flight", n, 7, more.len())?;
    let mut out = Vec::with_capacity(n);
    let mut id = 0u64;
    for _ in 0..n {
        type Wire = (i64, u64, u32, u32, u32, u32, u32);
        let ((d, seq, held, held_total, in_flight, demand, refused), after) =
            take::<Wire>(more, "in_flight", "not a report of seven varints")?;
        id = id.wrapping_add(d as u64);
        let report = Report { seq, held, held_total, in_flight, demand, refused };
        out.push(InFlightReport { id, report });
        more = after;
    }
    Ok((out, more))
}

/// Field 16 of an answer: the grants, one per reported counter.
fn grants(ctx: &Ctx, bytes: &[u8]) -> Result<Vec<InFlightGrant>, DecodeError> {
    let (n, mut more) = take::<u64>(bytes, "grants", "not a list")?;
    let n = ctx.reserve_tail("grants", n, 3, more.len())?;
    let mut out = Vec::with_capacity(n);
    let mut id = 0u64;
    for _ in 0..n {
        let ((d, share, lease_ns), after) =
            take::<(i64, u32, u64)>(more, "grants", "not a grant of three varints")?;
        id = id.wrapping_add(d as u64);
        out.push(InFlightGrant { id, grant: Grant { share, lease_ns } });
        more = after;
    }
    Ok(out)
}

/// Field 15: `(index, max_in_flight)` of the answer's quotas that cap requests in flight;
/// the bytes after it.
fn max_in_flight<'a>(r: &mut SyncResponse, rest: &'a [u8]) -> Result<&'a [u8], DecodeError> {
    let (n, mut rest) = take::<u64>(rest, "max_in_flight", "not a list")?;
    if n > r.quotas.len() as u64 {
        return Err(malformed("max_in_flight", "more than the quotas"));
    }
    for _ in 0..n {
        let ((i, c), more) = take::<(u32, u32)>(rest, "max_in_flight", "not a pair of varints")?;
        let q = r
            .quotas
            .get_mut(i as usize)
            .ok_or_else(|| malformed("max_in_flight", "index past the quotas"))?;
        q.limits = q
            .limits
            .with_max_in_flight(c)
            .map_err(|_| malformed("max_in_flight", "above 1000000"))?;
        rest = more;
    }
    Ok(rest)
}

/// Decodes an answer with at most `max_entries` counters + quotas.
pub(super) fn decode_response(
    body: &[u8],
    max_entries: usize,
) -> Result<SyncResponse, DecodeError> {
    let ctx = Ctx::new(max_entries);
    let mut d = postcard::Deserializer::from_bytes(body);
    let mut r = Message(&ctx, std::marker::PhantomData::<SyncResponse>)
        .deserialize(&mut d)
        .map_err(|e| ctx.finish(e))?;
    // Fields appended after the first revision: absent means their default.
    let rest = d.finalize().unwrap_or(&[]);
    if !rest.is_empty() {
        let bad = |why| DecodeError::Malformed { field: "shard", why };
        let (shard, rest) = postcard::take_from_bytes::<Option<(u32, u32)>>(rest).map_err(|e| {
            bad(if matches!(e, postcard::Error::DeserializeUnexpectedEnd) {
                "truncated"
            } else {
                "not an option of two varints"
            })
        })?;
        r.shard = match shard {
            None => None,
            Some((index, count)) => Some(
                format!("{index}/{count}").parse().map_err(|_| bad("not a valid INDEX/COUNT"))?,
            ),
        };
        if !rest.is_empty() {
            let (root_epoch, rest) =
                take::<Option<u64>>(rest, "root_epoch", "not an option of a varint")?;
            r.root_epoch = root_epoch;
            let (n, mut rest) = take::<u64>(rest, "resets", "not a list")?;
            if n > r.quotas.len() as u64 {
                return Err(malformed("resets", "more than the quotas"));
            }
            for _ in 0..n {
                let ((i, e), more) = take::<(u32, u64)>(rest, "resets", "not a pair of varints")?;
                let q = r
                    .quotas
                    .get_mut(i as usize)
                    .ok_or_else(|| malformed("resets", "index past the quotas"))?;
                q.reset_epoch = e;
                rest = more;
            }
            if !rest.is_empty() {
                let (secret, rest) =
                    take::<Option<(u64, u64)>>(rest, "key_secret", "not an option of two u64")?;
                r.key_secret = secret;
                if !rest.is_empty() {
                    let (n, rest) =
                        take::<Option<u32>>(rest, "limiters", "not an option of a varint")?;
                    r.limiters = n;
                    if !rest.is_empty() {
                        let rest = shadow_mode(&mut r, rest)?;
                        if !rest.is_empty() {
                            let rest = max_in_flight(&mut r, rest)?;
                            if !rest.is_empty() {
                                r.grants = grants(&ctx, rest)?;
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(r)
}
