//! The shared database for several roots: PostgreSQL.
//!
//! Every write transaction first takes a transaction-level advisory lock, so writers of all
//! roots are serialised from epoch assignment to commit and epoch order equals visibility
//! order (see the parent module). Reads take no lock.

use super::migrations::{self, Migration};
use super::{
    epoch_from_row, limits_from_row, to_i64, written, BoxFuture, GraphCheck, NewQuota, QuotaStore,
    StoreError, StoredQuota, Written,
};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};
use std::time::Duration;
use yarl_core::Epoch;

/// The advisory lock key of quota writes ("yarl" in ASCII).
const WRITE_LOCK: i64 = 0x7961_726c;
/// Rows per `INSERT … SELECT FROM UNNEST(…)` of a batch.
const INSERT_CHUNK: usize = 10_000;
/// Names per parent lookup.
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

/// The PostgreSQL quota store.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Connects to `postgres://…` and applies migrations.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(8)
            // A request waits this long for a connection while the server is down, then
            // gets 503; short enough for an admin at a terminal.
            .acquire_timeout(Duration::from_secs(3))
            .connect(url)
            .await?;
        let store = PgStore { pool };
        store.migrate().await?;
        Ok(store)
    }

    async fn begin_write(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(WRITE_LOCK).execute(&mut *tx).await?;
        Ok(tx)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        // The lock also keeps two roots starting at once from migrating twice.
        let mut tx = self.begin_write().await?;
        sqlx::query(migrations::CREATE_TABLE).execute(&mut *tx).await?;
        let applied: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM yarl_schema_migrations")
                .fetch_one(&mut *tx)
                .await?;
        let todo: &[Migration] =
            migrations::pending(migrations::POSTGRES, applied).map_err(StoreError::Invalid)?;
        for m in todo {
            for s in m.statements {
                sqlx::query(s).execute(&mut *tx).await?;
            }
            sqlx::query(
                "INSERT INTO yarl_schema_migrations (version, description) VALUES ($1, $2)",
            )
            .bind(m.version)
            .bind(m.description)
            .execute(&mut *tx)
            .await?;
            tracing::info!(version = m.version, "applied postgres migration: {}", m.description);
        }
        tx.commit().await?;
        Ok(())
    }

    async fn bump_epoch(tx: &mut Transaction<'_, Postgres>, n: usize) -> Result<Epoch, StoreError> {
        let new: i64 = sqlx::query_scalar(
            "UPDATE yarl_epoch SET epoch = epoch + $1 WHERE id = 1 RETURNING epoch",
        )
        .bind(to_i64(n as u64))
        .fetch_one(&mut **tx)
        .await?;
        Ok(epoch_from_row(new) - n as u64)
    }

    async fn check_graph(
        tx: &mut Transaction<'_, Postgres>,
        quotas: &[NewQuota],
    ) -> Result<(), StoreError> {
        let mut check = GraphCheck::new(quotas)?;
        while let Some(names) = check.wanted() {
            for chunk in names.chunks(LOOKUP_CHUNK) {
                let found: Vec<(String, Option<String>)> = sqlx::query_as(
                    "SELECT name, parent FROM yarl_quotas WHERE NOT deleted AND name = ANY($1)",
                )
                .bind(chunk)
                .fetch_all(&mut **tx)
                .await?;
                check.supply(chunk, found);
            }
        }
        check.finish()?;
        while let Some(names) = check.wanted_children() {
            for chunk in names.chunks(LOOKUP_CHUNK) {
                let found: Vec<(String, Option<String>)> = sqlx::query_as(
                    "SELECT name, parent FROM yarl_quotas WHERE NOT deleted AND parent = ANY($1)",
                )
                .bind(chunk)
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
        let mut tx = self.begin_write().await?;
        Self::check_graph(&mut tx, &quotas).await?;
        let base = Self::bump_epoch(&mut tx, quotas.len()).await?;
        let mut ids = vec![0u64; quotas.len()];
        for (c, chunk) in quotas.chunks(INSERT_CHUNK).enumerate() {
            let first = c * INSERT_CHUNK;
            let names: Vec<&str> = chunk.iter().map(|q| q.name.as_str()).collect();
            let limit: Vec<i64> = chunk.iter().map(|q| to_i64(q.limits.limit)).collect();
            let low: Vec<i64> = chunk.iter().map(|q| to_i64(q.limits.low_burst)).collect();
            let high: Vec<i64> = chunk.iter().map(|q| to_i64(q.limits.high_burst)).collect();
            let parent: Vec<Option<&str>> = chunk.iter().map(|q| q.parent.as_deref()).collect();
            let epoch: Vec<i64> =
                (0..chunk.len()).map(|k| to_i64(base + (first + k) as u64 + 1)).collect();
            let rows: Vec<(i64, i64)> = sqlx::query_as(
                "INSERT INTO yarl_quotas
                    (name, limit_milli, low_burst_milli, high_burst_milli, parent, epoch)
                 SELECT * FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::int8[],
                                      $5::text[], $6::int8[])
                 ON CONFLICT (name) DO UPDATE SET
                    limit_milli = EXCLUDED.limit_milli,
                    low_burst_milli = EXCLUDED.low_burst_milli,
                    high_burst_milli = EXCLUDED.high_burst_milli,
                    parent = EXCLUDED.parent,
                    epoch = EXCLUDED.epoch,
                    deleted = FALSE
                 RETURNING id, epoch",
            )
            .bind(names)
            .bind(limit)
            .bind(low)
            .bind(high)
            .bind(parent)
            .bind(epoch)
            .fetch_all(&mut *tx)
            .await?;
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
        let mut tx = self.begin_write().await?;
        let row: Option<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM yarl_quotas WHERE name = $1 AND NOT deleted"
        ))
        .bind(&name)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { return Err(StoreError::NotFound(name)) };
        let children: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM yarl_quotas WHERE parent = $1 AND NOT deleted
             ORDER BY name LIMIT 5",
        )
        .bind(&name)
        .fetch_all(&mut *tx)
        .await?;
        if !children.is_empty() {
            return Err(StoreError::HasChildren { name, children });
        }
        let base = Self::bump_epoch(&mut tx, 1).await?;
        sqlx::query(
            "UPDATE yarl_quotas SET deleted = TRUE, parent = NULL, epoch = $1 WHERE id = $2",
        )
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
            "SELECT {COLUMNS} FROM yarl_quotas WHERE name = $1 AND NOT deleted"
        ))
        .bind(name)
        .fetch_optional(&self.pool)
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
             WHERE NOT deleted AND name >= $1 AND name < $2 AND name > $3
             ORDER BY name LIMIT $4"
        ))
        .bind(prefix)
        .bind(upper)
        .bind(after.unwrap_or_default())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        from_rows(rows)
    }

    async fn changes_inner(
        &self,
        epoch: Epoch,
        limit: u32,
    ) -> Result<Vec<StoredQuota>, StoreError> {
        let rows: Vec<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM yarl_quotas WHERE epoch > $1 ORDER BY epoch LIMIT $2"
        ))
        .bind(to_i64(epoch))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        from_rows(rows)
    }
}

impl QuotaStore for PgStore {
    fn kind(&self) -> &'static str {
        "postgres"
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
