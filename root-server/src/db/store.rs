//! The one quota store: the same operations on SQLite and PostgreSQL, with the SQL that
//! differs between them in a [`Dialect`] each.
//!
//! * **SQLite** (`sqlite://PATH`): one file in WAL mode. Writes go through a pool of a
//!   single connection and start with `BEGIN IMMEDIATE`, which takes SQLite's write lock
//!   before anything is read; that serialises epoch assignment (see the parent module) and
//!   avoids the "read, then fail to upgrade to a write" deadlock of deferred transactions.
//!   Reads use a separate small pool and, thanks to WAL, never wait for a writer, so a long
//!   bulk load does not stall polls or `GET`s.
//! * **PostgreSQL** (`postgres://…`): every write transaction first takes a
//!   transaction-level advisory lock, so writers of all roots are serialised from epoch
//!   assignment to commit and epoch order equals visibility order. Reads take no lock.
//!   Writes have a pool of their own, as on SQLite: writes queued behind a long batch
//!   (of this root or another) hold only its connections, never the ones that answer
//!   `GET`s and the poller, and wait at most [`PG_LOCK_TIMEOUT`] for the lock.
//!
//! Queries shared by both use `$1`, `$2`, … placeholders (SQLite reads them as numbered
//! parameters) and `NOT deleted` / `TRUE` (SQLite stores the flag as 0/1). Where the two
//! really differ (batch inserts, passing a list of names, opening a write transaction) the
//! dialect says how. The code that runs the queries is written once and expanded for each
//! driver by [`each_backend!`], since sqlx's drivers are distinct types.

use super::migrate;
use super::{
    epoch_from_row, limits_from_row, to_i64, written, BoxFuture, GraphCheck, NewQuota, QuotaStore,
    StoreError, StoredQuota, Written,
};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Postgres, QueryBuilder, Sqlite, Transaction};
use std::str::FromStr;
use std::time::Duration;
use yarl_core::{Epoch, Limits};

/// How long a SQLite write waits for the lock (held by another process) before the
/// request fails with 503.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a PostgreSQL write waits for the write lock (a batch of a million quotas holds
/// it for tens of seconds) before the request fails with 503.
const PG_LOCK_TIMEOUT: &str = "30s";
/// The PostgreSQL advisory lock key of quota writes ("yarl" in ASCII).
const PG_WRITE_LOCK: i64 = 0x7961_726c;

/// The SQL of one database.
#[derive(Debug)]
pub(super) struct Dialect {
    /// `"sqlite"` or `"postgres"`.
    pub kind: &'static str,
    /// Rows per batch `INSERT`: SQLite binds 9 parameters per row and allows 32,766;
    /// PostgreSQL binds nine arrays whatever the count.
    pub insert_chunk: usize,
    /// Names per parent lookup.
    pub lookup_chunk: usize,
    /// Live `(name, parent)` rows whose name is in the list bound as `$1`.
    pub live_by_name: &'static str,
    /// Live `(name, parent)` rows whose parent is in the list bound as `$1`.
    pub live_by_parent: &'static str,
}

pub(super) const SQLITE: Dialect = Dialect {
    kind: "sqlite",
    insert_chunk: 3_500,
    lookup_chunk: 50_000,
    // A list is passed as one JSON array: SQLite has no array type.
    live_by_name: "SELECT name, parent FROM yarl_quotas
                   WHERE NOT deleted AND name IN (SELECT value FROM json_each($1))",
    live_by_parent: "SELECT name, parent FROM yarl_quotas
                     WHERE NOT deleted AND parent IN (SELECT value FROM json_each($1))",
};

pub(super) const POSTGRES: Dialect = Dialect {
    kind: "postgres",
    insert_chunk: 10_000,
    lookup_chunk: 50_000,
    live_by_name: "SELECT name, parent FROM yarl_quotas WHERE NOT deleted AND name = ANY($1)",
    live_by_parent: "SELECT name, parent FROM yarl_quotas WHERE NOT deleted AND parent = ANY($1)",
};

/// A few live children of the quota bound as `$1` (what a delete refuses to orphan).
const LIVE_CHILDREN: &str =
    "SELECT name FROM yarl_quotas WHERE parent = $1 AND NOT deleted ORDER BY name LIMIT 5";

const COLUMNS: &str = "id, name, epoch, deleted, limit_milli, low_burst_milli, high_burst_milli, \
                       parent, reset_epoch, dry_run, per_s, max_in_flight";

/// A quota made again after a delete keeps its id and starts empty: its reset epoch moves
/// to the new epoch, as a reset's would, so that every root empties its counter (one that
/// polls after both writes sees only an edit) and counts sent before the delete, delivered
/// late, are dropped rather than summed into the new quota.
const UPSERT_SET: &str = " ON CONFLICT (name) DO UPDATE SET
    limit_milli = excluded.limit_milli,
    low_burst_milli = excluded.low_burst_milli,
    high_burst_milli = excluded.high_burst_milli,
    dry_run = excluded.dry_run,
    per_s = excluded.per_s,
    max_in_flight = excluded.max_in_flight,
    parent = excluded.parent,
    epoch = excluded.epoch,
    reset_epoch = CASE WHEN yarl_quotas.deleted THEN excluded.epoch
                       ELSE yarl_quotas.reset_epoch END,
    deleted = FALSE
 RETURNING id, epoch, reset_epoch";

type Row = (i64, String, i64, bool, i64, i64, i64, Option<String>, i64, bool, i64, i64);

fn from_row(r: Row) -> Result<StoredQuota, StoreError> {
    let (id, name, epoch, deleted, l, lo, hi, parent, reset_epoch, dry_run, per, in_flight) = r;
    Ok(StoredQuota {
        id: u64::try_from(id).unwrap_or(0),
        limits: limits_from_row(&name, l, per, lo, hi, in_flight)?.with_dry_run(dry_run),
        name,
        epoch: epoch_from_row(epoch),
        deleted,
        parent,
        reset_epoch: epoch_from_row(reset_epoch),
    })
}

fn from_rows(rows: Vec<Row>) -> Result<Vec<StoredQuota>, StoreError> {
    rows.into_iter().map(from_row).collect()
}

#[derive(Debug, Clone)]
enum Backend {
    Sqlite { writer: SqlitePool, reader: SqlitePool },
    Postgres { writer: PgPool, pool: PgPool },
}

/// The quota store over SQLite or PostgreSQL.
#[derive(Debug, Clone)]
pub struct SqlStore {
    backend: Backend,
}

/// Runs `$body` with `$w` bound to a write transaction of whichever
/// database this is, and `$d` to its dialect: the body is compiled once per driver.
macro_rules! each_backend {
    ($self:ident, write($w:ident, $d:ident) => $body:block) => {
        match &$self.backend {
            Backend::Sqlite { writer, .. } => {
                let $d = &SQLITE;
                #[allow(unused_mut)]
                let mut $w: Transaction<'static, Sqlite> =
                    writer.begin_with("BEGIN IMMEDIATE").await?;
                $body
            }
            Backend::Postgres { writer, .. } => {
                let $d = &POSTGRES;
                #[allow(unused_mut)]
                let mut $w: Transaction<'static, Postgres> = writer.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(PG_WRITE_LOCK)
                    .execute(&mut *$w)
                    .await?;
                $body
            }
        }
    };
    ($self:ident, read($r:ident) => $body:block) => {
        match &$self.backend {
            Backend::Sqlite { reader, .. } => {
                let $r = reader;
                $body
            }
            Backend::Postgres { pool, .. } => {
                let $r = pool;
                $body
            }
        }
    };
}

/// A list of names as the dialect's lookups take it: a JSON array for SQLite.
trait NameList<'q>: sqlx::Database {
    fn bind_names(
        q: sqlx::query::QueryAs<
            'q,
            Self,
            (String, Option<String>),
            <Self as sqlx::Database>::Arguments<'q>,
        >,
        names: &'q [String],
    ) -> sqlx::query::QueryAs<
        'q,
        Self,
        (String, Option<String>),
        <Self as sqlx::Database>::Arguments<'q>,
    >;
}

impl<'q> NameList<'q> for Sqlite {
    fn bind_names(
        q: sqlx::query::QueryAs<
            'q,
            Self,
            (String, Option<String>),
            sqlx::sqlite::SqliteArguments<'q>,
        >,
        names: &'q [String],
    ) -> sqlx::query::QueryAs<'q, Self, (String, Option<String>), sqlx::sqlite::SqliteArguments<'q>>
    {
        q.bind(serde_json::to_string(names).unwrap_or_else(|_| "[]".into()))
    }
}

impl<'q> NameList<'q> for Postgres {
    fn bind_names(
        q: sqlx::query::QueryAs<'q, Self, (String, Option<String>), sqlx::postgres::PgArguments>,
        names: &'q [String],
    ) -> sqlx::query::QueryAs<'q, Self, (String, Option<String>), sqlx::postgres::PgArguments> {
        q.bind(names)
    }
}

impl SqlStore {
    /// Opens `sqlite://PATH` (created if missing) or connects to `postgres://…`, and
    /// brings the schema up to date.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let backend = if url.starts_with("sqlite:") {
            let opts = SqliteConnectOptions::from_str(url)
                .map_err(|e| StoreError::Invalid(format!("bad sqlite URL {url:?}: {e}")))?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                // With WAL, NORMAL cannot corrupt the file; a power cut may lose the last
                // commits, which the admin re-sends. FULL would halve bulk-load speed.
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(SQLITE_BUSY_TIMEOUT);
            let writer = SqlitePoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(opts.clone())
                .await?;
            let reader = SqlitePoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(5))
                .connect_lazy_with(opts);
            migrate::sqlite(&writer).await?;
            Backend::Sqlite { writer, reader }
        } else {
            let pool = PgPoolOptions::new()
                .max_connections(8)
                // A request waits this long for a connection while the server is down, then
                // gets 503; short enough for an admin at a terminal.
                .acquire_timeout(Duration::from_secs(3))
                .connect(url)
                .await?;
            migrate::postgres(&pool).await?;
            let opts = PgConnectOptions::from_str(url)
                .map_err(|e| StoreError::Invalid(format!("bad postgres URL: {e}")))?
                .options([("lock_timeout", PG_LOCK_TIMEOUT)]);
            let writer = PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(30))
                .connect_lazy_with(opts);
            Backend::Postgres { writer, pool }
        };
        Ok(SqlStore { backend })
    }

    fn dialect(&self) -> &'static Dialect {
        match self.backend {
            Backend::Sqlite { .. } => &SQLITE,
            Backend::Postgres { .. } => &POSTGRES,
        }
    }

    async fn put_many_inner(&self, quotas: Vec<NewQuota>) -> Result<Written, StoreError> {
        self.write_batch_inner(quotas, Vec::new()).await
    }

    async fn write_batch_inner(
        &self,
        quotas: Vec<NewQuota>,
        deletes: Vec<String>,
    ) -> Result<Written, StoreError> {
        if quotas.is_empty() && deletes.is_empty() {
            return Ok(Written::default());
        }
        check_distinct(&quotas, &deletes)?;
        each_backend!(
            self,
            write(tx, d) => {
                check_graph(&mut tx, d, &quotas).await?;
                let live = lookup(&mut tx, d, d.live_by_name, &deletes).await?;
                let (deletes, items) = doomed(deletes, quotas.len(), live)?;
                let base = bump_epoch(&mut tx, quotas.len() + deletes.len()).await?;
                let mut kept = vec![(0u64, 0); quotas.len()];
                for (c, chunk) in quotas.chunks(d.insert_chunk).enumerate() {
                    let first = base + (c * d.insert_chunk) as u64;
                    let rows = insert_chunk(&mut tx, chunk, first).await?;
                    for (id, epoch, reset_epoch) in rows {
                        let k = epoch_from_row(epoch).wrapping_sub(base + 1) as usize;
                        if let Some(slot) = kept.get_mut(k) {
                            *slot = (u64::try_from(id).unwrap_or(0), epoch_from_row(reset_epoch));
                        }
                    }
                }
                // Tombstones exactly as `delete_inner` writes them, after the upserts so
                // that a quota moved away from a deleted parent is moved first.
                let sql = format!(
                    "UPDATE yarl_quotas SET deleted = TRUE, parent = NULL, epoch = $1
                     WHERE name = $2 AND NOT deleted RETURNING {COLUMNS}"
                );
                let mut tombs = Vec::with_capacity(deletes.len());
                for (k, name) in deletes.iter().enumerate() {
                    let epoch = base + (quotas.len() + k) as u64 + 1;
                    let row: Option<Row> = sqlx::query_as(&sql)
                        .bind(to_i64(epoch))
                        .bind(name)
                        .fetch_optional(&mut *tx)
                        .await?;
                    let row = row.ok_or_else(|| StoreError::NotFound(name.clone()))?;
                    tombs.push(from_row(row)?);
                }
                let children = lookup(&mut tx, d, d.live_by_parent, &deletes).await?;
                check_orphans(&deletes, &items, children)?;
                tx.commit().await?;
                let mut w = written(base, quotas, kept);
                w.quotas.extend(tombs);
                Ok(w)
            }
        )
    }

    async fn delete_inner(&self, name: String) -> Result<Written, StoreError> {
        each_backend!(
            self,
            write(tx, _d) => {
                let row = live_row(&mut tx, &name).await?;
                let children: Vec<String> = sqlx::query_scalar(LIVE_CHILDREN)
                .bind(&name)
                .fetch_all(&mut *tx)
                .await?;
                if !children.is_empty() {
                    return Err(StoreError::HasChildren { name, children, index: None });
                }
                let base = bump_epoch(&mut tx, 1).await?;
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
        )
    }

    async fn reset_inner(&self, name: String) -> Result<Written, StoreError> {
        each_backend!(
            self,
            write(tx, _d) => {
                let row = live_row(&mut tx, &name).await?;
                let base = bump_epoch(&mut tx, 1).await?;
                sqlx::query("UPDATE yarl_quotas SET epoch = $1, reset_epoch = $1 WHERE id = $2")
                    .bind(to_i64(base + 1))
                    .bind(row.0)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                let mut q = from_row(row)?;
                q.epoch = base + 1;
                q.reset_epoch = base + 1;
                Ok(Written { base_epoch: base, quotas: vec![q] })
            }
        )
    }

    async fn reset_key_inner(&self, name: String, limits: Limits) -> Result<Written, StoreError> {
        let live = format!(
            "UPDATE yarl_quotas SET epoch = $1, reset_epoch = $1 WHERE name = $2 AND NOT deleted
             RETURNING {COLUMNS}"
        );
        // The key's tombstone: the template's numbers fill the row's columns (nothing reads
        // them), and a tombstone left by a deleted override is reused.
        let tomb = format!(
            "INSERT INTO yarl_quotas
                (name, limit_milli, low_burst_milli, high_burst_milli, parent, epoch, dry_run,
                 per_s, max_in_flight, deleted, reset_epoch)
             VALUES ($1, $2, $3, $4, NULL, $5, $6, $7, $8, TRUE, $5)
             ON CONFLICT (name) DO UPDATE SET
                epoch = excluded.epoch, reset_epoch = excluded.reset_epoch, deleted = TRUE
             RETURNING {COLUMNS}"
        );
        each_backend!(
            self,
            write(tx, _d) => {
                let base = bump_epoch(&mut tx, 1).await?;
                let epoch = to_i64(base + 1);
                // A quota of that name made since the caller looked is reset as a quota.
                let row: Option<Row> = sqlx::query_as(&live)
                    .bind(epoch)
                    .bind(&name)
                    .fetch_optional(&mut *tx)
                    .await?;
                let row = match row {
                    Some(row) => row,
                    None => {
                        sqlx::query_as(&tomb)
                            .bind(&name)
                            .bind(to_i64(limits.limit().milli()))
                            .bind(to_i64(limits.low_burst()))
                            .bind(to_i64(limits.high_burst()))
                            .bind(epoch)
                            .bind(limits.dry_run())
                            .bind(to_i64(limits.window_secs()))
                            .bind(i64::from(limits.max_in_flight()))
                            .fetch_one(&mut *tx)
                            .await?
                    }
                };
                tx.commit().await?;
                Ok(Written { base_epoch: base, quotas: vec![from_row(row)?] })
            }
        )
    }

    async fn get_inner(&self, name: String) -> Result<Option<StoredQuota>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM yarl_quotas WHERE name = $1 AND NOT deleted");
        let row: Option<Row> = each_backend!(
            self,
            read(r) => { sqlx::query_as(&sql).bind(name).fetch_optional(r).await? }
        );
        row.map(from_row).transpose()
    }

    async fn key_secret_inner(&self) -> Result<(u64, u64), StoreError> {
        let sql = "SELECT value FROM yarl_settings WHERE name = 'key_secret'";
        let row: Option<(String,)> = each_backend!(
            self,
            read(r) => { sqlx::query_as(sql).fetch_optional(r).await? }
        );
        let hex = row.map(|r| r.0).unwrap_or_default();
        let half = |h: &str| u64::from_str_radix(h, 16).ok();
        match (hex.len(), hex.get(..16).and_then(half), hex.get(16..).and_then(half)) {
            (32, Some(a), Some(b)) => Ok((a, b)),
            _ => Err(StoreError::Invalid("the database holds no valid key_secret setting".into())),
        }
    }

    async fn list_inner(
        &self,
        prefix: String,
        after: Option<String>,
        limit: u32,
    ) -> Result<Vec<StoredQuota>, StoreError> {
        let upper = format!("{prefix}\u{7f}");
        let sql = format!(
            "SELECT {COLUMNS} FROM yarl_quotas
             WHERE NOT deleted AND name >= $1 AND name < $2 AND name > $3
             ORDER BY name LIMIT $4"
        );
        let after = after.unwrap_or_default();
        let rows: Vec<Row> = each_backend!(
            self,
            read(r) => {
                sqlx::query_as(&sql)
                    .bind(prefix)
                    .bind(upper)
                    .bind(after)
                    .bind(i64::from(limit))
                    .fetch_all(r)
                    .await?
            }
        );
        from_rows(rows)
    }

    async fn changes_inner(
        &self,
        epoch: Epoch,
        limit: u32,
    ) -> Result<Vec<StoredQuota>, StoreError> {
        let sql =
            format!("SELECT {COLUMNS} FROM yarl_quotas WHERE epoch > $1 ORDER BY epoch LIMIT $2");
        let rows: Vec<Row> = each_backend!(
            self,
            read(r) => {
                sqlx::query_as(&sql).bind(to_i64(epoch)).bind(i64::from(limit)).fetch_all(r).await?
            }
        );
        from_rows(rows)
    }
}

/// The live row called `name`, read inside the write transaction (so it cannot change
/// before the write commits); `NotFound` if there is none.
async fn live_row<DB>(tx: &mut Transaction<'static, DB>, name: &str) -> Result<Row, StoreError>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    Row: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let sql = format!("SELECT {COLUMNS} FROM yarl_quotas WHERE name = $1 AND NOT deleted");
    let row: Option<Row> = sqlx::query_as(&sql).bind(name).fetch_optional(&mut **tx).await?;
    row.ok_or_else(|| StoreError::NotFound(name.to_owned()))
}

/// Takes `n` epochs in the write transaction; returns the highest epoch before them.
async fn bump_epoch<DB>(tx: &mut Transaction<'static, DB>, n: usize) -> Result<Epoch, StoreError>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Decode<'static, DB> + sqlx::Type<DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let (new,): (i64,) =
        sqlx::query_as("UPDATE yarl_epoch SET epoch = epoch + $1 WHERE id = 1 RETURNING epoch")
            .bind(to_i64(n as u64))
            .fetch_one(&mut **tx)
            .await?;
    Ok(epoch_from_row(new) - n as u64)
}

/// The parent-graph checks of a write (see [`GraphCheck`]), with the dialect's lookups.
async fn check_graph<DB>(
    tx: &mut Transaction<'static, DB>,
    d: &Dialect,
    quotas: &[NewQuota],
) -> Result<(), StoreError>
where
    DB: sqlx::Database + for<'q> NameList<'q>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    (String, Option<String>): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let mut check = GraphCheck::new(quotas)?;
    while let Some(names) = check.wanted() {
        let found = lookup(tx, d, d.live_by_name, &names).await?;
        check.supply(&names, found);
    }
    check.finish()?;
    while let Some(names) = check.wanted_children() {
        let found = lookup(tx, d, d.live_by_parent, &names).await?;
        check.supply_children(found)?;
    }
    Ok(())
}

/// Refuses a name deleted twice or both written and deleted (writes among themselves are
/// `GraphCheck`'s). Indexes count the writes first, then the deletes.
fn check_distinct(quotas: &[NewQuota], deletes: &[String]) -> Result<(), StoreError> {
    if deletes.is_empty() {
        return Ok(());
    }
    let mut seen: std::collections::HashMap<&str, usize> =
        quotas.iter().enumerate().map(|(i, q)| (q.name.as_str(), i)).collect();
    for (k, name) in deletes.iter().enumerate() {
        let index = quotas.len() + k;
        if let Some(&first) = seen.get(name.as_str()) {
            return Err(StoreError::Duplicate { index, first, name: name.clone() });
        }
        seen.insert(name, index);
    }
    Ok(())
}

/// The quotas to delete, checked to be live (`DeleteNotFound` names the first that is not)
/// and ordered children first: every prefix of the write's epochs then leaves no live
/// quota under a tombstone, for a poller that stops between two of them. `live` holds the
/// live `(name, parent)` rows among `deletes`, whose items are numbered from `first`.
/// Also returns each ordered delete's item index.
fn doomed(
    deletes: Vec<String>,
    first: usize,
    live: Vec<(String, Option<String>)>,
) -> Result<(Vec<String>, Vec<usize>), StoreError> {
    let live: std::collections::HashMap<String, Option<String>> = live.into_iter().collect();
    if let Some(k) = deletes.iter().position(|n| !live.contains_key(n)) {
        return Err(StoreError::DeleteNotFound { index: first + k, name: deletes[k].clone() });
    }
    // Ancestors that are deleted too; the database graph is acyclic and chains are short.
    let doomed_above = |name: &str| {
        let mut n = 0usize;
        let mut cur = live.get(name).cloned().flatten();
        while let Some(p) = cur {
            if n > yarl_core::MAX_CHAIN || !live.contains_key(&p) {
                break;
            }
            n += 1;
            cur = live.get(&p).cloned().flatten();
        }
        n
    };
    let mut ordered: Vec<(usize, usize, String)> =
        deletes.into_iter().enumerate().map(|(k, n)| (doomed_above(&n), first + k, n)).collect();
    ordered.sort_by_key(|o| std::cmp::Reverse(o.0));
    Ok(ordered.into_iter().map(|(_, i, n)| (n, i)).unzip())
}

/// After a write's tombstones: refuses it if a live quota still names one of them as its
/// parent (it was neither deleted nor moved by the same write), as a single delete does.
/// `children` holds the live `(name, parent)` rows whose parent is among `deletes`, whose
/// item indexes are `items`.
fn check_orphans(
    deletes: &[String],
    items: &[usize],
    children: Vec<(String, Option<String>)>,
) -> Result<(), StoreError> {
    let Some(k) = deletes.iter().position(|n| children.iter().any(|(_, p)| p.as_ref() == Some(n)))
    else {
        return Ok(());
    };
    let parent = &deletes[k];
    let mut names: Vec<String> =
        children.into_iter().filter(|(_, p)| p.as_ref() == Some(parent)).map(|(c, _)| c).collect();
    names.sort();
    names.truncate(5);
    Err(StoreError::HasChildren {
        name: parent.clone(),
        children: names,
        index: items.get(k).copied(),
    })
}

/// The `(name, parent)` rows a dialect lookup (`live_by_name`, `live_by_parent`) finds for
/// `names`, a chunk at a time.
async fn lookup<DB>(
    tx: &mut Transaction<'static, DB>,
    d: &Dialect,
    sql: &'static str,
    names: &[String],
) -> Result<Vec<(String, Option<String>)>, StoreError>
where
    DB: sqlx::Database + for<'q> NameList<'q>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    (String, Option<String>): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let mut found = Vec::new();
    for chunk in names.chunks(d.lookup_chunk) {
        let q = sqlx::query_as::<DB, (String, Option<String>)>(sql);
        found.extend(DB::bind_names(q, chunk).fetch_all(&mut **tx).await?);
    }
    Ok(found)
}

/// `(id, epoch, reset_epoch)` of an inserted or replaced row.
type Upserted = (i64, i64, i64);

/// Inserts or replaces one chunk of a batch whose first row gets epoch `first + 1`;
/// returns `(id, epoch, reset_epoch)` of every row.
trait InsertChunk: sqlx::Database {
    fn insert_chunk<'t>(
        tx: &'t mut Transaction<'static, Self>,
        chunk: &'t [NewQuota],
        first: Epoch,
    ) -> BoxFuture<'t, Result<Vec<Upserted>, StoreError>>;
}

impl InsertChunk for Sqlite {
    fn insert_chunk<'t>(
        tx: &'t mut Transaction<'static, Self>,
        chunk: &'t [NewQuota],
        first: Epoch,
    ) -> BoxFuture<'t, Result<Vec<Upserted>, StoreError>> {
        Box::pin(async move {
            // One multi-row VALUES list (SQLite has no arrays to bind).
            let mut qb: QueryBuilder<Sqlite> = QueryBuilder::new(
                "INSERT INTO yarl_quotas
                 (name, limit_milli, low_burst_milli, high_burst_milli, parent, epoch, dry_run,
                  per_s, max_in_flight) ",
            );
            qb.push_values(chunk.iter().enumerate(), |mut b, (k, q)| {
                b.push_bind(q.name.as_str())
                    .push_bind(to_i64(q.limits.limit().milli()))
                    .push_bind(to_i64(q.limits.low_burst()))
                    .push_bind(to_i64(q.limits.high_burst()))
                    .push_bind(q.parent.as_deref())
                    .push_bind(to_i64(first + k as u64 + 1))
                    .push_bind(q.limits.dry_run())
                    .push_bind(to_i64(q.limits.window_secs()))
                    .push_bind(i64::from(q.limits.max_in_flight()));
            });
            qb.push(UPSERT_SET);
            Ok(qb.build_query_as().fetch_all(&mut **tx).await?)
        })
    }
}

impl InsertChunk for Postgres {
    fn insert_chunk<'t>(
        tx: &'t mut Transaction<'static, Self>,
        chunk: &'t [NewQuota],
        first: Epoch,
    ) -> BoxFuture<'t, Result<Vec<Upserted>, StoreError>> {
        Box::pin(async move {
            // Nine arrays, one row per element: one statement whatever the chunk size.
            let names: Vec<&str> = chunk.iter().map(|q| q.name.as_str()).collect();
            let limit: Vec<i64> = chunk.iter().map(|q| to_i64(q.limits.limit().milli())).collect();
            let low: Vec<i64> = chunk.iter().map(|q| to_i64(q.limits.low_burst())).collect();
            let high: Vec<i64> = chunk.iter().map(|q| to_i64(q.limits.high_burst())).collect();
            let parent: Vec<Option<&str>> = chunk.iter().map(|q| q.parent.as_deref()).collect();
            let epoch: Vec<i64> = (0..chunk.len()).map(|k| to_i64(first + k as u64 + 1)).collect();
            let dry_run: Vec<bool> = chunk.iter().map(|q| q.limits.dry_run()).collect();
            let per: Vec<i64> = chunk.iter().map(|q| to_i64(q.limits.window_secs())).collect();
            let in_flight: Vec<i64> =
                chunk.iter().map(|q| i64::from(q.limits.max_in_flight())).collect();
            let sql = format!(
                "INSERT INTO yarl_quotas
                    (name, limit_milli, low_burst_milli, high_burst_milli, parent, epoch, dry_run,
                     per_s, max_in_flight)
                 SELECT * FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::int8[],
                                      $5::text[], $6::int8[], $7::bool[], $8::int8[],
                                      $9::int8[]){UPSERT_SET}"
            );
            Ok(sqlx::query_as(&sql)
                .bind(names)
                .bind(limit)
                .bind(low)
                .bind(high)
                .bind(parent)
                .bind(epoch)
                .bind(dry_run)
                .bind(per)
                .bind(in_flight)
                .fetch_all(&mut **tx)
                .await?)
        })
    }
}

async fn insert_chunk<DB: InsertChunk>(
    tx: &mut Transaction<'static, DB>,
    chunk: &[NewQuota],
    first: Epoch,
) -> Result<Vec<Upserted>, StoreError> {
    DB::insert_chunk(tx, chunk, first).await
}

impl QuotaStore for SqlStore {
    fn kind(&self) -> &'static str {
        self.dialect().kind
    }

    fn put_many(&self, quotas: Vec<NewQuota>) -> BoxFuture<'_, Result<Written, StoreError>> {
        Box::pin(self.put_many_inner(quotas))
    }

    fn write_batch(
        &self,
        quotas: Vec<NewQuota>,
        deletes: Vec<String>,
    ) -> BoxFuture<'_, Result<Written, StoreError>> {
        Box::pin(self.write_batch_inner(quotas, deletes))
    }

    fn delete(&self, name: String) -> BoxFuture<'_, Result<Written, StoreError>> {
        Box::pin(self.delete_inner(name))
    }

    fn reset(&self, name: String) -> BoxFuture<'_, Result<Written, StoreError>> {
        Box::pin(self.reset_inner(name))
    }

    fn reset_key(
        &self,
        name: String,
        limits: Limits,
    ) -> BoxFuture<'_, Result<Written, StoreError>> {
        Box::pin(self.reset_key_inner(name, limits))
    }

    fn get(&self, name: String) -> BoxFuture<'_, Result<Option<StoredQuota>, StoreError>> {
        Box::pin(self.get_inner(name))
    }

    fn key_secret(&self) -> BoxFuture<'_, Result<(u64, u64), StoreError>> {
        Box::pin(self.key_secret_inner())
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

    fn db_epoch(&self) -> BoxFuture<'_, Result<Epoch, StoreError>> {
        Box::pin(async move {
            let (e,): (i64,) = each_backend!(
                self,
                read(r) => {
                    sqlx::query_as("SELECT epoch FROM yarl_epoch WHERE id = 1").fetch_one(r).await?
                }
            );
            Ok(epoch_from_row(e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every PUT looks up its quota's children and every DELETE checks for some, inside the
    /// write lock: with a million quotas a scan costs about 0.2 s each, so both must use
    /// the parent index (SQLite takes a partial index only when the query repeats its
    /// condition's terms).
    #[tokio::test]
    async fn sqlite_finds_children_through_the_parent_index() {
        let dir = std::env::temp_dir().join(format!("yarl-plan-{}.db", std::process::id()));
        let url = format!("sqlite://{}", dir.display());
        let store = SqlStore::open(&url).await.unwrap();
        let Backend::Sqlite { writer, .. } = &store.backend else { unreachable!() };
        for sql in [SQLITE.live_by_parent, LIVE_CHILDREN] {
            let rows: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(&format!("EXPLAIN QUERY PLAN {sql}"))
                    .bind("p")
                    .fetch_all(writer)
                    .await
                    .unwrap();
            let plan: Vec<&str> = rows.iter().map(|r| r.3.as_str()).collect();
            assert!(
                plan.iter().any(|l| l.contains("USING INDEX yarl_quotas_parent")),
                "{sql}: {plan:?}"
            );
        }
        drop(store);
        for ext in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{ext}", dir.display()));
        }
    }
}
