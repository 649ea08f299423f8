//! The quota database: the [`QuotaStore`] trait and its one implementation,
//! [`SqlStore`], over either database, with per-dialect SQL where they differ:
//!
//! * SQLite: an embedded file (`sqlite://yarl.db`), the default for a single root. Created
//!   with its schema on first start.
//! * PostgreSQL: a shared server (`postgres://…`) for several roots.
//!
//! The schema comes from `sqlx::migrate!`, one folder of numbered SQL files per database
//! (`root-server/migrations/{sqlite,postgres}`); see `migrate.rs`.
//!
//! # Epochs are the change log
//!
//! Every write (create, replace, delete) gives each row it touches a new epoch above all
//! others, taken from a one-row counter table in the *same* transaction; deletes keep the row
//! as a tombstone carrying its epoch. Roots poll `epoch > last_seen` in epoch order. That is
//! only correct if epoch order equals commit order: a row that got epoch 7 but commits after
//! a row with epoch 8 became visible would be skipped by a poller that already moved past 8.
//! So writers are serialised from the epoch assignment until commit: PostgreSQL takes a
//! transaction-level advisory lock first, SQLite starts the transaction `IMMEDIATE` (one
//! writer per file anyway).
//!
//! All checks that depend on other rows (the parent exists, no cycle, chain depth, no
//! children on delete) run inside that transaction, after the lock, so two roots cannot
//! race each other into an invalid graph.

mod graph;
mod migrate;
mod store;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use yarl_core::{Epoch, Limits, QuotaId, QuotaUpdate};

pub use graph::GraphCheck;
pub use store::SqlStore;

/// A boxed, sendable future: the trait is used as `Arc<dyn QuotaStore>`, and `async fn` in
/// traits is not object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A row of the quota table: a live quota or a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredQuota {
    /// Never reused for another name; a re-created quota keeps its id.
    pub id: QuotaId,
    /// Unique name.
    pub name: String,
    /// Epoch of the last write to this row.
    pub epoch: Epoch,
    /// A tombstone.
    pub deleted: bool,
    /// The numbers (fixed point); a tombstone keeps its last values.
    pub limits: Limits,
    /// Parent's name.
    pub parent: Option<String>,
    /// The epoch of the quota's last cluster-wide reset, 0 if never.
    pub reset_epoch: Epoch,
}

impl StoredQuota {
    /// The form roots and limiters apply.
    pub fn into_update(self) -> QuotaUpdate {
        QuotaUpdate {
            id: self.id,
            name: self.name,
            epoch: self.epoch,
            deleted: self.deleted,
            reset_epoch: self.reset_epoch,
            limits: self.limits,
            parent: self.parent,
        }
    }
}

/// A quota to create or replace, already validated with `QuotaSpec::validate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewQuota {
    /// Unique name.
    pub name: String,
    /// The numbers.
    pub limits: Limits,
    /// Parent's name; must name a live quota or another quota of the same write.
    pub parent: Option<String>,
}

/// What a write did.
#[derive(Debug, Clone, Default)]
pub struct Written {
    /// The highest epoch in the database before this write. Every epoch in
    /// `base_epoch + 1 ..= base_epoch + quotas.len()` belongs to this write, so a root that
    /// has seen exactly `base_epoch` may apply `quotas` without reading them back.
    pub base_epoch: Epoch,
    /// The rows written, in epoch order.
    pub quotas: Vec<StoredQuota>,
}

impl Written {
    /// The highest epoch this write assigned (`base_epoch` for an empty write).
    pub fn last_epoch(&self) -> Epoch {
        self.quotas.last().map_or(self.base_epoch, |q| q.epoch)
    }
}

/// Why a database operation failed. Item indexes count from 0 in the order given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The parent is neither a live quota nor part of the same write.
    #[error("parent {parent:?} of quota {name:?} does not exist")]
    UnknownParent {
        /// Index of the item.
        index: usize,
        /// The item's name.
        name: String,
        /// The missing parent.
        parent: String,
    },
    /// The write would close a parent cycle.
    #[error("quota {name:?} would close a parent cycle: {}", .cycle.join(" -> "))]
    Cycle {
        /// Index of the item.
        index: usize,
        /// The item's name.
        name: String,
        /// The cycle, starting and ending with the same name.
        cycle: Vec<String>,
    },
    /// The write would make a parent chain longer than limiters follow.
    #[error("quota {name:?} would have a parent chain of {depth} quotas, the maximum is {max}")]
    ChainTooDeep {
        /// Index of the item.
        index: usize,
        /// The item's name.
        name: String,
        /// The chain length including the quota itself.
        depth: usize,
        /// The maximum ([`yarl_core::MAX_CHAIN`]).
        max: usize,
    },
    /// The write would push a descendant's parent chain past what limiters follow.
    #[error(
        "quota {name:?} would give its descendant {descendant:?} a parent chain of {depth} \
         quotas, the maximum is {max}"
    )]
    DescendantTooDeep {
        /// Index of the item.
        index: usize,
        /// The item's name.
        name: String,
        /// The descendant whose chain grows too long.
        descendant: String,
        /// That descendant's chain length including itself.
        depth: usize,
        /// The maximum ([`yarl_core::MAX_CHAIN`]).
        max: usize,
    },
    /// The same name appears twice in one batch.
    #[error("quota {name:?} appears twice (items {first} and {index})")]
    Duplicate {
        /// Index of the second occurrence.
        index: usize,
        /// Index of the first occurrence.
        first: usize,
        /// The name.
        name: String,
    },
    /// No live quota has this name.
    #[error("quota {0:?} does not exist")]
    NotFound(String),
    /// A delete of a batch names no live quota.
    #[error("quota {name:?} does not exist")]
    DeleteNotFound {
        /// Index of the item.
        index: usize,
        /// The name.
        name: String,
    },
    /// The quota is another quota's parent.
    #[error(
        "quota {name:?} is the parent of {}; delete them or give them another parent first",
        .children.iter().map(|c| format!("{c:?}")).collect::<Vec<_>>().join(", ")
    )]
    HasChildren {
        /// The quota to delete.
        name: String,
        /// Some of its children (at most five).
        children: Vec<String>,
        /// Index of the delete, in a batch.
        index: Option<usize>,
    },
    /// The database could not be reached or refused the operation.
    #[error("quota database unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// The database holds something this binary cannot use.
    #[error("quota database: {0}")]
    Invalid(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::Unavailable(e)
    }
}

impl StoreError {
    /// The same error with its item index (if any) passed through `f`: for a caller whose
    /// items were split or reordered before the write.
    pub fn map_index(mut self, f: impl Fn(usize) -> usize) -> Self {
        match &mut self {
            StoreError::UnknownParent { index, .. }
            | StoreError::Cycle { index, .. }
            | StoreError::ChainTooDeep { index, .. }
            | StoreError::DescendantTooDeep { index, .. }
            | StoreError::DeleteNotFound { index, .. }
            | StoreError::HasChildren { index: Some(index), .. } => *index = f(*index),
            StoreError::Duplicate { index, first, .. } => {
                *index = f(*index);
                *first = f(*first);
            }
            _ => {}
        }
        self
    }

    /// The index of the offending item of a write, if the error is about one.
    pub fn item_index(&self) -> Option<usize> {
        match self {
            StoreError::UnknownParent { index, .. }
            | StoreError::Cycle { index, .. }
            | StoreError::ChainTooDeep { index, .. }
            | StoreError::DescendantTooDeep { index, .. }
            | StoreError::Duplicate { index, .. }
            | StoreError::DeleteNotFound { index, .. }
            | StoreError::HasChildren { index: Some(index), .. } => Some(*index),
            _ => None,
        }
    }
}

/// The quota database. Implementations must be safe to share between tasks and between
/// several roots on one database (see the module docs on epochs).
pub trait QuotaStore: Send + Sync + 'static {
    /// `"sqlite"` or `"postgres"`, for logs and metrics.
    fn kind(&self) -> &'static str;

    /// Creates or replaces all `quotas` in one transaction, or none of them. Each gets its
    /// own epoch, in the order given.
    fn put_many(&self, quotas: Vec<NewQuota>) -> BoxFuture<'_, Result<Written, StoreError>>;

    /// Creates or replaces `quotas` and turns the live quotas `deletes` into tombstones, in
    /// one transaction, or none of it: the writes first, in the order given, then the
    /// tombstones (children before their parents), each with its own epoch, exactly as
    /// [`QuotaStore::delete`] writes them. A delete of a name that is not live fails with
    /// `NotFound`; one that leaves a live child under a tombstone with `HasChildren`.
    /// Item indexes in errors count `quotas` first, then `deletes`.
    fn write_batch(
        &self,
        quotas: Vec<NewQuota>,
        deletes: Vec<String>,
    ) -> BoxFuture<'_, Result<Written, StoreError>>;

    /// Turns a live quota into a tombstone with a new epoch.
    fn delete(&self, name: String) -> BoxFuture<'_, Result<Written, StoreError>>;

    /// Resets a live quota cluster-wide: a new epoch for its row, and `reset_epoch` set to
    /// that epoch (its numbers and parent stay as they are).
    fn reset(&self, name: String) -> BoxFuture<'_, Result<Written, StoreError>>;

    /// Resets the key `name` (a name under a template, with no live quota of its own)
    /// cluster-wide. Keys have no rows, so the reset is recorded as a tombstone of the name
    /// whose `reset_epoch` is its new epoch (`limits`, the template's, fill its columns);
    /// roots and limiters that apply it empty the key's counter, and the key stays under
    /// its template. A live quota of that name is reset as [`QuotaStore::reset`] does.
    fn reset_key(&self, name: String, limits: Limits)
        -> BoxFuture<'_, Result<Written, StoreError>>;

    /// The live quota called `name`.
    fn get(&self, name: String) -> BoxFuture<'_, Result<Option<StoredQuota>, StoreError>>;

    /// The cluster's secret for the wire ids of keys (names under templates), made when
    /// the database was created.
    fn key_secret(&self) -> BoxFuture<'_, Result<(u64, u64), StoreError>>;

    /// Live quotas whose name starts with `prefix` and sorts after `after`, by name
    /// (bytewise), at most `limit`.
    fn list(
        &self,
        prefix: String,
        after: Option<String>,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<StoredQuota>, StoreError>>;

    /// Rows (tombstones included) with an epoch above `epoch`, in epoch order, at most
    /// `limit`.
    fn changes_since(
        &self,
        epoch: Epoch,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<StoredQuota>, StoreError>>;

    /// The database's epoch counter: the epoch of its latest write. Only grows while the
    /// database lives; below what a root applied, the database was recreated or restored.
    fn db_epoch(&self) -> BoxFuture<'_, Result<Epoch, StoreError>>;
}

/// Opens (and migrates) the database named by `url`: `sqlite://PATH` or `postgres://…`.
pub async fn open(url: &str) -> Result<Arc<dyn QuotaStore>, StoreError> {
    if url.starts_with("sqlite:")
        || url.starts_with("postgres://")
        || url.starts_with("postgresql://")
    {
        Ok(Arc::new(SqlStore::open(url).await?))
    } else {
        Err(StoreError::Invalid(format!(
            "unsupported database URL {:?}: use sqlite://PATH or postgres://…",
            redact(url)
        )))
    }
}

/// The URL without a password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &userinfo[..c], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Limits are stored as `BIGINT` milli-units: every accepted value fits in `i64` (bursts are
/// at most 1e18 milli-units), so the casts are exact; a value that does not fit means the
/// row was not written by a root.
fn limits_from_row(
    name: &str,
    limit: i64,
    per: i64,
    low: i64,
    high: i64,
    max_in_flight: i64,
) -> Result<Limits, StoreError> {
    let conv = |v: i64| {
        u64::try_from(v).map_err(|_| {
            StoreError::Invalid(format!("quota {name:?} has a negative value in the database"))
        })
    };
    let in_flight = u32::try_from(max_in_flight).map_err(|_| {
        StoreError::Invalid(format!(
            "quota {name:?} has max_in_flight {max_in_flight} in the database"
        ))
    })?;
    Limits::from_milli_per(conv(limit)?, conv(per)?, conv(low)?, conv(high)?)
        .and_then(|l| l.with_max_in_flight(in_flight))
        .map_err(|e| StoreError::Invalid(format!("quota {name:?} in the database: {e}")))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The rows of a successful `put_many`, built from the input and the `(id, reset_epoch)`
/// the database returned, instead of read back. A replaced quota keeps its last reset.
fn written(base: Epoch, quotas: Vec<NewQuota>, kept: Vec<(u64, Epoch)>) -> Written {
    let quotas = quotas
        .into_iter()
        .zip(kept)
        .enumerate()
        .map(|(k, (q, (id, reset_epoch)))| StoredQuota {
            id,
            name: q.name,
            epoch: base + k as u64 + 1,
            deleted: false,
            limits: q.limits,
            parent: q.parent,
            reset_epoch,
        })
        .collect();
    Written { base_epoch: base, quotas }
}

fn epoch_from_row(e: i64) -> Epoch {
    u64::try_from(e).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("postgres://u:secret@h:5/db"), "postgres://u:***@h:5/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://yarl.db"), "sqlite://yarl.db");
    }
}
