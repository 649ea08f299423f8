//! The embedded database: one SQLite file in WAL mode.
//!
//! Writes go through a pool of a single connection and start with `BEGIN IMMEDIATE`, which
//! takes SQLite's write lock before anything is read; that serialises epoch assignment (see
//! the parent module) and avoids the "read, then fail to upgrade to a write" deadlock of
//! deferred transactions. Reads use a separate small pool and, thanks to WAL, never wait
//! for a writer, so a long bulk load does not stall polls or `GET`s.

use super::migrations::{self, Migration};
use super::{
    epoch_from_row, limits_from_row, to_i64, written, BoxFuture, GraphCheck, NewQuota, QuotaStore,
    StoreError, StoredQuota, Written,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Sqlite, Transaction};
use std::str::FromStr;
use std::time::Duration;
use yarl_core::Epoch;

/// How long a write waits for SQLite's lock (held by another process) before the request
/// fails with 503.
const BUSY_TIMEOUT: Duration = Duration::from_secs(2);
/// Rows per `INSERT` of a batch: 6 parameters each stays below SQLite's 32766.
const INSERT_CHUNK: usize = 5_000;
/// Names per parent lookup (passed as one JSON array).
const LOOKUP_CHUNK: usize = 50_000;

const COLUMNS: &str =
    "id, name, epoch, deleted, limit_milli, low_burst_milli, high_burst_milli, parent";

type Row = (i64, String, i64, bool, i64, i64, i64, Option<String>);

fn from_row(r: Row) -> Result<StoredQuota, StoreError> {
    let (id, name, epoch, deleted, l, lo, hi, parent) = r;
    Ok(StoredQuota {
        id: u64::try_from(id).unwrap_or(0),
        limits: limits_from_row(&name, l, lo, hi)?,
        name,
        epoch: epoch_from_row(epoch),
        deleted,
        parent,
    })
}

fn from_rows(rows: Vec<Row>) -> Result<Vec<StoredQuota>, StoreError> {
    rows.into_iter().map(from_row).collect()
}

/// The SQLite quota store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
}

impl SqliteStore {
    /// Opens `sqlite://PATH` (created if missing) and applies migrations.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let opts = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Invalid(format!("bad sqlite URL {url:?}: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // With WAL, NORMAL cannot corrupt the file; a power cut may lose the last
            // commits, which the admin re-sends. FULL would halve bulk-load speed.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts.clone())
            .await?;
        let store = SqliteStore {
            writer,
            reader: SqlitePoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(5))
                .connect_lazy_with(opts),
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(migrations::CREATE_TABLE).execute(&mut *tx).await?;
        let applied: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM yarl_schema_migrations")
                .fetch_one(&mut *tx)
                .await?;
        let todo: &[Migration] =
            migrations::pending(migrations::SQLITE, applied).map_err(StoreError::Invalid)?;
        for m in todo {
            for s in m.statements {
                sqlx::query(s).execute(&mut *tx).await?;
            }
            sqlx::query("INSERT INTO yarl_schema_migrations (version, description) VALUES (?, ?)")
                .bind(m.version)
                .bind(m.description)
                .execute(&mut *tx)
                .await?;
            tracing::info!(version = m.version, "applied sqlite migration: {}", m.description);
        }
        tx.commit().await?;
        Ok(())
    }

    async fn bump_epoch(tx: &mut Transaction<'_, Sqlite>, n: usize) -> Result<Epoch, StoreError> {
        let new: i64 = sqlx::query_scalar(
            "UPDATE yarl_epoch SET epoch = epoch + ? WHERE id = 1 RETURNING epoch",
        )
        .bind(to_i64(n as u64))
        .fetch_one(&mut **tx)
        .await?;
        Ok(epoch_from_row(new) - n as u64)
    }

    async fn check_graph(
        tx: &mut Transaction<'_, Sqlite>,
        quotas: &[NewQuota],
    ) -> Result<(), StoreError> {
        let mut check = GraphCheck::new(quotas)?;
        while let Some(names) = check.wanted() {
            for chunk in names.chunks(LOOKUP_CHUNK) {
                let json = serde_json::to_string(chunk).unwrap_or_else(|_| "[]".into());
                let found: Vec<(String, Option<String>)> = sqlx::query_as(
                    "SELECT name, parent FROM yarl_quotas
                     WHERE deleted = 0 AND name IN (SELECT value FROM json_each(?))",
                )
                .bind(json)
                .fetch_all(&mut **tx)
                .await?;
                check.supply(chunk, found);
            }
        }
        check.finish()?;
        while let Some(names) = check.wanted_children() {
            for chunk in names.chunks(LOOKUP_CHUNK) {
                let json = serde_json::to_string(chunk).unwrap_or_else(|_| "[]".into());
                let found: Vec<(String, Option<String>)> = sqlx::query_as(
                    "SELECT name, parent FROM yarl_quotas
                     WHERE deleted = 0 AND parent IN (SELECT value FROM json_each(?))",
                )
                .bind(json)
                .fetch_all(&mut **tx)
                .await?;
                check.supply_children(found)?;
            }
        }
        Ok(())
    }

    async fn put_many_inner(&self, quotas: Vec<NewQuota>) -> Result<Written, StoreError> {
        if quotas.is_empty() {
            return Ok(Written::default());
        }
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        Self::check_graph(&mut tx, &quotas).await?;
        let base = Self::bump_epoch(&mut tx, quotas.len()).await?;
        let mut ids = vec![0u64; quotas.len()];
        for (c, chunk) in quotas.chunks(INSERT_CHUNK).enumerate() {
            let first = c * INSERT_CHUNK;
            let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
                "INSERT INTO yarl_quotas
                 (name, limit_milli, low_burst_milli, high_burst_milli, parent, epoch) ",
            );
            qb.push_values(chunk.iter().enumerate(), |mut b, (k, q)| {
                b.push_bind(q.name.as_str())
                    .push_bind(to_i64(q.limits.limit))
                    .push_bind(to_i64(q.limits.low_burst))
                    .push_bind(to_i64(q.limits.high_burst))
                    .push_bind(q.parent.as_deref())
                    .push_bind(to_i64(base + (first + k) as u64 + 1));
            });
            qb.push(
                " ON CONFLICT (name) DO UPDATE SET
                    limit_milli = excluded.limit_milli,
                    low_burst_milli = excluded.low_burst_milli,
                    high_burst_milli = excluded.high_burst_milli,
                    parent = excluded.parent,
                    epoch = excluded.epoch,
                    deleted = 0
                 RETURNING id, epoch",
            );
            let rows: Vec<(i64, i64)> = qb.build_query_as().fetch_all(&mut *tx).await?;
            for (id, epoch) in rows {
                let k = epoch_from_row(epoch).wrapping_sub(base + 1) as usize;
                if let Some(slot) = ids.get_mut(k) {
                    *slot = u64::try_from(id).unwrap_or(0);
                }
            }
        }
        tx.commit().await?;
        Ok(written(base, quotas, ids))
    }

    async fn delete_inner(&self, name: String) -> Result<Written, StoreError> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let row: Option<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM yarl_quotas WHERE name = ? AND deleted = 0"
        ))
        .bind(&name)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Err(StoreError::NotFound(name)) };
        let children: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM yarl_quotas WHERE parent = ? AND deleted = 0 ORDER BY name LIMIT 5",
        )
        .bind(&name)
        .fetch_all(&mut *tx)
        .await?;
        if !children.is_empty() {
            return Err(StoreError::HasChildren { name, children });
        }
        let base = Self::bump_epoch(&mut tx, 1).await?;
        sqlx::query("UPDATE yarl_quotas SET deleted = 1, parent = NULL, epoch = ? WHERE id = ?")
            .bind(to_i64(base + 1))
            .bind(row.0)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        let mut q = from_row(row)?;
        q.epoch = base + 1;
        q.deleted = true;
        q.parent = None;
        Ok(Written { base_epoch: base, quotas: vec![q] })
    }

    async fn get_inner(&self, name: String) -> Result<Option<StoredQuota>, StoreError> {
        let row: Option<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM yarl_quotas WHERE name = ? AND deleted = 0"
        ))
        .bind(name)
        .fetch_optional(&self.reader)
        .await?;
        row.map(from_row).transpose()
    }

    async fn list_inner(
        &self,
        prefix: String,
        after: Option<String>,
        limit: u32,
    ) -> Result<Vec<StoredQuota>, StoreError> {
        let upper = format!("{prefix}\u{7f}");
        let rows: Vec<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM yarl_quotas
             WHERE deleted = 0 AND name >= ? AND name < ? AND name > ?
             ORDER BY name LIMIT ?"
        ))
        .bind(prefix)
        .bind(upper)
        .bind(after.unwrap_or_default())
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        from_rows(rows)
    }

    async fn changes_inner(
        &self,
        epoch: Epoch,
        limit: u32,
    ) -> Result<Vec<StoredQuota>, StoreError> {
        let rows: Vec<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM yarl_quotas WHERE epoch > ? ORDER BY epoch LIMIT ?"
        ))
        .bind(to_i64(epoch))
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        from_rows(rows)
    }
}

impl QuotaStore for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn put_many(&self, quotas: Vec<NewQuota>) -> BoxFuture<'_, Result<Written, StoreError>> {
        Box::pin(self.put_many_inner(quotas))
    }

    fn delete(&self, name: String) -> BoxFuture<'_, Result<Written, StoreError>> {
        Box::pin(self.delete_inner(name))
    }

    fn get(&self, name: String) -> BoxFuture<'_, Result<Option<StoredQuota>, StoreError>> {
        Box::pin(self.get_inner(name))
    }

    fn list(
        &self,
        prefix: String,
        after: Option<String>,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<StoredQuota>, StoreError>> {
        Box::pin(self.list_inner(prefix, after, limit))
    }

    fn changes_since(
        &self,
        epoch: Epoch,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<StoredQuota>, StoreError>> {
        Box::pin(self.changes_inner(epoch, limit))
    }
}
