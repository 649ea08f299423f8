//! The serializers of protocol v2: the messages' fields in wire order, ids as differences.

use super::{ResponseParts, WIRE_VERSION};
use crate::proto::{DeltaBatch, InFlightGrant, InFlightReport, SyncRequest};
use crate::quota::{QuotaId, QuotaUpdate};
use serde::ser::{SerializeSeq, SerializeTuple};
use serde::{Serialize, Serializer};

/// A list of items whose ids are written as wrapping differences.
struct Delta<'a, T, F>(&'a [T], F);

impl<T, F, S> Serialize for Delta<'_, T, F>
where
    F: Fn(&T, i64) -> S,
    S: Serialize,
    T: HasId,
{
    fn serialize<Z: Serializer>(&self, s: Z) -> Result<Z::Ok, Z::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        let mut prev: u64 = 0;
        for item in self.0 {
            let id = item.id();
            seq.serialize_element(&(self.1)(item, id.wrapping_sub(prev) as i64))?;
            prev = id;
        }
        seq.end()
    }
}

trait HasId {
    fn id(&self) -> u64;
}

impl HasId for InFlightReport {
    fn id(&self) -> u64 {
        self.id
    }
}

impl HasId for InFlightGrant {
    fn id(&self) -> u64 {
        self.id
    }
}

impl HasId for (QuotaId, u64, u64) {
    fn id(&self) -> u64 {
        self.0
    }
}

impl HasId for QuotaId {
    fn id(&self) -> u64 {
        *self
    }
}

impl HasId for (QuotaId, u64) {
    fn id(&self) -> u64 {
        self.0
    }
}

struct Batches<'a>(&'a [DeltaBatch]);

impl Serialize for Batches<'_> {
    fn serialize<Z: Serializer>(&self, s: Z) -> Result<Z::Ok, Z::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for b in self.0 {
            seq.serialize_element(&(
                b.seq,
                Delta(&b.deltas, |d: &(u64, u64, u64), k| (k, d.1, d.2)),
            ))?;
        }
        seq.end()
    }
}

struct Quotas<'a, Q>(&'a [Q]);

impl<Q: AsRef<QuotaUpdate>> Serialize for Quotas<'_, Q> {
    fn serialize<Z: Serializer>(&self, s: Z) -> Result<Z::Ok, Z::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        let (mut id, mut epoch) = (0u64, 0u64);
        for q in self.0 {
            let q = q.as_ref();
            seq.serialize_element(&(
                q.id.wrapping_sub(id) as i64,
                q.name.as_str(),
                q.epoch.wrapping_sub(epoch) as i64,
                q.deleted,
                q.limits.limit().word(),
                q.limits.low_burst(),
                q.limits.high_burst(),
                q.parent.as_deref(),
            ))?;
            id = q.id;
            epoch = q.epoch;
        }
        seq.end()
    }
}

/// The fields of a request in wire order.
pub(super) struct RequestWire<'a>(pub(super) &'a SyncRequest);

impl Serialize for RequestWire<'_> {
    fn serialize<Z: Serializer>(&self, s: Z) -> Result<Z::Ok, Z::Error> {
        let r = self.0;
        // Fields 8 and 9 (resets) only when they say something, 10 and 11 (interest) only
        // when asked for: a request from a limiter that predates them stays byte for byte
        // what it was.
        let drained = r.batches.iter().any(|b| !b.drained.is_empty());
        let aged = drained || r.view_age_ns.is_some();
        let reports = aged || !r.in_flight.is_empty();
        let hinted = reports || r.hinted_seq.is_some();
        let keys = hinted || !r.key_templates.is_empty();
        let interest = keys || r.interest || !r.watch.is_empty();
        let resets =
            interest || r.seen_epoch.is_some() || r.batches.iter().any(|b| b.epoch.is_some());
        let fields = if drained {
            16
        } else if aged {
            15
        } else if reports {
            14
        } else if hinted {
            13
        } else if keys {
            12
        } else if interest {
            11
        } else if resets {
            9
        } else {
            7
        };
        let mut t = s.serialize_tuple(fields)?;
        t.serialize_element(&WIRE_VERSION)?;
        t.serialize_element(r.limiter.as_str())?;
        t.serialize_element(&r.root_instance)?;
        t.serialize_element(&r.since)?;
        t.serialize_element(&r.epoch)?;
        t.serialize_element(&Batches(&r.batches))?;
        t.serialize_element(&Delta(&r.hints, |h: &(u64, u64), k| (k, h.1)))?;
        if resets {
            t.serialize_element(&r.seen_epoch)?;
            let epochs: Vec<Option<u64>> = r.batches.iter().map(|b| b.epoch).collect();
            t.serialize_element(&epochs)?;
        }
        if interest {
            t.serialize_element(&r.interest)?;
            t.serialize_element(&Delta(&r.watch, |_: &u64, k| k))?;
        }
        if keys {
            t.serialize_element(&Delta(&r.key_templates, |p: &(u64, u64), k| (k, p.1)))?;
        }
        if hinted {
            t.serialize_element(&r.hinted_seq)?;
        }
        if reports {
            t.serialize_element(&Delta(&r.in_flight, |f: &InFlightReport, k| {
                let p = &f.report;
                (k, p.seq, p.held, p.held_total, p.in_flight, p.demand, p.refused)
            }))?;
        }
        if aged {
            t.serialize_element(&r.view_age_ns)?;
        }
        if drained {
            let per: Vec<&[u64]> = r.batches.iter().map(|b| b.drained.as_slice()).collect();
            t.serialize_element(&per)?;
        }
        t.end()
    }
}

pub(super) struct ResponseWire<'a, Q>(pub(super) ResponseParts<'a, Q>);

impl<Q: AsRef<QuotaUpdate>> Serialize for ResponseWire<'_, Q> {
    fn serialize<Z: Serializer>(&self, s: Z) -> Result<Z::Ok, Z::Error> {
        let r = &self.0;
        // Fields 10 and 11 (resets) only when they say something, like the request's.
        let resets: Vec<(u32, u64)> = r
            .quotas
            .iter()
            .enumerate()
            .filter(|(_, q)| q.as_ref().reset_epoch != 0)
            .map(|(i, q)| (i as u32, q.as_ref().reset_epoch))
            .collect();
        // Field 14 (the quotas in shadow mode, by index) only when one is: a limiter that
        // predates it stops reading after field 13.
        let shadow: Vec<u32> = r
            .quotas
            .iter()
            .enumerate()
            .filter(|(_, q)| q.as_ref().limits.dry_run())
            .map(|(i, _)| i as u32)
            .collect();
        // Field 15 (`max_in_flight`, by index) only when a quota has one.
        let in_flight: Vec<(u32, u32)> = r
            .quotas
            .iter()
            .enumerate()
            .filter(|(_, q)| q.as_ref().limits.max_in_flight() != 0)
            .map(|(i, q)| (i as u32, q.as_ref().limits.max_in_flight()))
            .collect();
        let grants = !r.grants.is_empty();
        let caps = grants || !in_flight.is_empty();
        let peers = r.limiters.is_some() || !shadow.is_empty() || caps;
        let keys = peers || r.key_secret.is_some();
        let more_fields = keys || r.root_epoch.is_some() || !resets.is_empty();
        let fields = if grants {
            16
        } else if caps {
            15
        } else if !shadow.is_empty() {
            14
        } else if peers {
            13
        } else if keys {
            12
        } else if more_fields {
            11
        } else {
            9
        };
        let mut t = s.serialize_tuple(fields)?;
        t.serialize_element(&WIRE_VERSION)?;
        t.serialize_element(&r.root_instance)?;
        t.serialize_element(&r.acked_seq)?;
        t.serialize_element(&r.version)?;
        t.serialize_element(&r.epoch)?;
        t.serialize_element(&r.more)?;
        t.serialize_element(&Delta(r.counters, |c: &(u64, u64, u64), k| (k, c.1, c.2)))?;
        t.serialize_element(&Quotas(r.quotas))?;
        t.serialize_element(&r.shard.map(|s| (s.index, s.count)))?;
        if more_fields {
            t.serialize_element(&r.root_epoch)?;
            t.serialize_element(&resets)?;
        }
        if keys {
            t.serialize_element(&r.key_secret)?;
        }
        if peers {
            t.serialize_element(&r.limiters)?;
        }
        if !shadow.is_empty() || caps {
            t.serialize_element(&shadow)?;
        }
        if caps {
            t.serialize_element(&in_flight)?;
        }
        if grants {
            t.serialize_element(&Delta(r.grants, |g: &InFlightGrant, k| {
                (k, g.grant.share, g.grant.lease_ns)
            }))?;
        }
        t.end()
    }
}
