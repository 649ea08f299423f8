//! Schema migrations with `sqlx::migrate!`: one folder per database
//! (`root-server/migrations/sqlite`, `root-server/migrations/postgres`), embedded in the
//! binary and applied in order at start. sqlx records what it applied in
//! `_sqlx_migrations` and refuses to start on a database with a migration this binary does
//! not know (so an old root never writes into a newer layout). Append new files; never
//! edit an applied one (sqlx checks their checksums).
//!
//! # Databases of the hand-written runner
//!
//! Before sqlx, roots kept their own record in `yarl_schema_migrations (version,
//! description)`, and version 1 created exactly what `0001_quotas.sql` creates. A database
//! with that table and no sqlx record is *adopted*: every version it lists is entered into
//! `_sqlx_migrations` as applied, with the checksum of the file of that version, inside
//! the same lock that writers take, and then sqlx applies whatever comes after. The old
//! table is left as it was.

use super::StoreError;
use sqlx::migrate::{Migrate, MigrateError, Migrator};
use sqlx::{PgPool, SqlitePool};

static SQLITE: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES: Migrator = sqlx::migrate!("./migrations/postgres");

/// The advisory lock quota writes take (see `store.rs`): adoption holds it too.
const PG_WRITE_LOCK: i64 = 0x7961_726c;

fn failed(e: MigrateError) -> StoreError {
    match e {
        MigrateError::Execute(e) => StoreError::Unavailable(e),
        MigrateError::VersionMissing(v) => StoreError::Invalid(format!(
            "schema version {v} was applied by a newer yarl-root than this one; upgrade yarl-root"
        )),
        e => StoreError::Invalid(format!("schema migration: {e}")),
    }
}

/// The versions the old runner recorded, if it ran here and sqlx has not yet.
/// `exists_sql` tells whether the table named by `{}` exists.
async fn old_versions<DB>(
    conn: &mut DB::Connection,
    exists_sql: &str,
) -> Result<Vec<i64>, sqlx::Error>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    (bool,): for<'r> sqlx::FromRow<'r, DB::Row>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    let exists_old: (bool,) = sqlx::query_as(&exists_sql.replace("{}", "yarl_schema_migrations"))
        .fetch_one(&mut *conn)
        .await?;
    if !exists_old.0 {
        return Ok(Vec::new());
    }
    let exists_sqlx: (bool,) =
        sqlx::query_as(&exists_sql.replace("{}", "_sqlx_migrations")).fetch_one(&mut *conn).await?;
    if exists_sqlx.0 {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM _sqlx_migrations").fetch_one(&mut *conn).await?;
        if n > 0 {
            return Ok(Vec::new());
        }
    }
    let rows: Vec<(i64,)> =
        sqlx::query_as("SELECT version FROM yarl_schema_migrations ORDER BY version")
            .fetch_all(&mut *conn)
            .await?;
    Ok(rows.into_iter().map(|r| r.0).collect())
}

fn checksum(m: &Migrator, version: i64) -> Result<Vec<u8>, StoreError> {
    m.iter().find(|x| x.version == version).map(|x| x.checksum.to_vec()).ok_or_else(|| {
        StoreError::Invalid(format!(
            "schema version {version} (recorded by an older yarl-root) is unknown to this one"
        ))
    })
}

/// Brings a SQLite database up to date.
pub(super) async fn sqlite(pool: &SqlitePool) -> Result<(), StoreError> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let old = old_versions::<sqlx::Sqlite>(
        &mut tx,
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{}')",
    )
    .await?;
    if !old.is_empty() {
        tx.ensure_migrations_table().await.map_err(failed)?;
        for v in old {
            sqlx::query(
                "INSERT INTO _sqlx_migrations
                 (version, description, success, checksum, execution_time)
                 VALUES ($1, 'adopted from yarl_schema_migrations', TRUE, $2, 0)",
            )
            .bind(v)
            .bind(checksum(&SQLITE, v)?)
            .execute(&mut *tx)
            .await?;
            tracing::info!(version = v, "sqlite schema: adopted the hand-written runner's version");
        }
    }
    tx.commit().await?;
    SQLITE.run(pool).await.map_err(failed)
}

/// Brings a PostgreSQL database up to date (two roots starting at once are serialised
/// by the lock writers take, and by sqlx's own).
pub(super) async fn postgres(pool: &PgPool) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(PG_WRITE_LOCK).execute(&mut *tx).await?;
    let old = old_versions::<sqlx::Postgres>(
        &mut tx,
        "SELECT EXISTS (SELECT 1 FROM information_schema.tables
                        WHERE table_schema = current_schema() AND table_name = '{}')",
    )
    .await?;
    if !old.is_empty() {
        tx.ensure_migrations_table().await.map_err(failed)?;
        for v in old {
            sqlx::query(
                "INSERT INTO _sqlx_migrations
                 (version, description, success, checksum, execution_time)
                 VALUES ($1, 'adopted from yarl_schema_migrations', TRUE, $2, 0)",
            )
            .bind(v)
            .bind(checksum(&POSTGRES, v)?)
            .execute(&mut *tx)
            .await?;
            tracing::info!(
                version = v,
                "postgres schema: adopted the hand-written runner's version"
            );
        }
    }
    tx.commit().await?;
    POSTGRES.run(pool).await.map_err(failed)
}
