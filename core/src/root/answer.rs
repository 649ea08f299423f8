//! What a root answers to a sync, shared with its tables rather than copied.

use crate::proto::SyncResponse;
use crate::quota::{Epoch, QuotaId, QuotaUpdate};
use crate::shard::Shard;
use serde::ser::{SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};
use std::sync::Arc;

/// What one root answers: a [`SyncResponse`] whose quotas are shared with the root's table
/// rather than copied, so building it under the root's lock costs one reference count per
/// quota and the JSON is written after the lock is released. Serialises exactly as the
/// [`SyncResponse`] it converts into.
#[derive(Debug, Clone)]
pub struct SyncAnswer {
    /// Protocol version.
    pub v: u32,
    /// Random id of this root process.
    pub root_instance: u64,
    /// Highest batch `seq` of this limiter the root has applied.
    pub acked_seq: u64,
    /// The root's counter version now.
    pub version: u64,
    /// Counters changed since `since`: `[id, fill, demand]`, in no particular order, and
    /// an id may appear twice (with the same values) until [`SyncAnswer::tidy`] runs:
    /// that work is left for after the root's lock.
    pub counters: Vec<(QuotaId, u64, u64)>,
    /// Quotas and tombstones above the limiter's epoch, in epoch order.
    pub quotas: Vec<Arc<QuotaUpdate>>,
    /// The epoch the limiter holds once it applied `quotas`.
    pub epoch: Epoch,
    /// More quotas are waiting.
    pub more: bool,
    /// The highest epoch this root applied.
    pub root_epoch: Epoch,
    /// The shard this root aggregates.
    pub shard: Option<Shard>,
}

impl SyncAnswer {
    /// Sorts the counters by id and drops repeated ids (v2 encodes each id as the
    /// difference to the previous one).
    pub fn tidy(&mut self) {
        self.counters.sort_unstable_by_key(|c| c.0);
        self.counters.dedup_by_key(|c| c.0);
    }

    /// The owned wire message, tidied.
    pub fn into_response(mut self) -> SyncResponse {
        self.tidy();
        SyncResponse {
            v: self.v,
            root_instance: self.root_instance,
            acked_seq: self.acked_seq,
            version: self.version,
            counters: self.counters,
            quotas: self.quotas.into_iter().map(|q| (*q).clone()).collect(),
            epoch: self.epoch,
            more: self.more,
            root_epoch: Some(self.root_epoch),
            shard: self.shard,
        }
    }
}

struct QuotaList<'a>(&'a [Arc<QuotaUpdate>]);

impl Serialize for QuotaList<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for q in self.0 {
            seq.serialize_element(&**q)?;
        }
        seq.end()
    }
}

impl Serialize for SyncAnswer {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Field for field what `#[derive(Serialize)]` writes for `SyncResponse`.
        let mut st = s.serialize_struct("SyncResponse", 9 + usize::from(self.shard.is_some()))?;
        st.serialize_field("v", &self.v)?;
        st.serialize_field("root_instance", &self.root_instance)?;
        st.serialize_field("acked_seq", &self.acked_seq)?;
        st.serialize_field("version", &self.version)?;
        st.serialize_field("counters", &self.counters)?;
        st.serialize_field("quotas", &QuotaList(&self.quotas))?;
        st.serialize_field("epoch", &self.epoch)?;
        st.serialize_field("more", &self.more)?;
        st.serialize_field("root_epoch", &self.root_epoch)?;
        if let Some(shard) = &self.shard {
            st.serialize_field("shard", &shard.to_string())?;
        }
        st.end()
    }
}
