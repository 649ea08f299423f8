//! Databases created by the hand-written migration runner that `sqlx::migrate!` replaced
//! open cleanly: their schema is adopted as version 1, their quotas and epochs stay, and
//! writes go on from there. The old runner's statements are kept here verbatim.

mod common;

use common::*;
use sqlx::Connection;
use yarl_core::Limits;
use yarl_root::db::{self, NewQuota};

/// What the old runner executed for version 1, and its bookkeeping.
const OLD_SQLITE: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS yarl_schema_migrations (
        version BIGINT PRIMARY KEY,
        description TEXT NOT NULL
    )",
    "CREATE TABLE yarl_quotas (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL UNIQUE,
        limit_milli INTEGER NOT NULL,
        low_burst_milli INTEGER NOT NULL,
        high_burst_milli INTEGER NOT NULL,
        parent TEXT,
        epoch INTEGER NOT NULL UNIQUE,
        deleted INTEGER NOT NULL DEFAULT 0
    )",
    "CREATE INDEX yarl_quotas_parent ON yarl_quotas (parent)
        WHERE parent IS NOT NULL AND deleted = 0",
    "CREATE TABLE yarl_epoch (id INTEGER PRIMARY KEY CHECK (id = 1), epoch INTEGER NOT NULL)",
    "INSERT INTO yarl_epoch (id, epoch) VALUES (1, 0)",
    "INSERT INTO yarl_schema_migrations (version, description)
        VALUES (1, 'quotas with epochs and tombstones')",
    // Rows as the old store wrote them: a parent, a child, a tombstone.
    "INSERT INTO yarl_quotas (name, limit_milli, low_burst_milli, high_burst_milli, parent, epoch, deleted)
        VALUES ('p', 1000, 2000, 3000, NULL, 1, 0), ('c', 500, 0, 1000, 'p', 2, 0),
               ('gone', 1000, 0, 0, NULL, 3, 1)",
    "UPDATE yarl_epoch SET epoch = 3",
];

const OLD_POSTGRES: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS yarl_schema_migrations (
        version BIGINT PRIMARY KEY,
        description TEXT NOT NULL
    )",
    r#"CREATE TABLE yarl_quotas (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name TEXT COLLATE "C" NOT NULL UNIQUE,
        limit_milli BIGINT NOT NULL,
        low_burst_milli BIGINT NOT NULL,
        high_burst_milli BIGINT NOT NULL,
        parent TEXT COLLATE "C",
        epoch BIGINT NOT NULL UNIQUE,
        deleted BOOLEAN NOT NULL DEFAULT FALSE
    )"#,
    "CREATE INDEX yarl_quotas_parent ON yarl_quotas (parent)
        WHERE parent IS NOT NULL AND NOT deleted",
    "CREATE TABLE yarl_epoch (id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL)",
    "INSERT INTO yarl_epoch (id, epoch) VALUES (1, 0)",
    "INSERT INTO yarl_schema_migrations (version, description)
        VALUES (1, 'quotas with epochs and tombstones')",
    "INSERT INTO yarl_quotas (name, limit_milli, low_burst_milli, high_burst_milli, parent, epoch, deleted)
        VALUES ('p', 1000, 2000, 3000, NULL, 1, FALSE), ('c', 500, 0, 1000, 'p', 2, FALSE),
               ('gone', 1000, 0, 0, NULL, 3, TRUE)",
    "UPDATE yarl_epoch SET epoch = 3",
];

async fn check_adopted(url: &str) {
    for round in 0..2 {
        // Opening twice: the second start finds sqlx's record and adopts nothing.
        let store = db::open(url).await.unwrap_or_else(|e| panic!("open #{round}: {e}"));
        let c = store.get("c".into()).await.unwrap().unwrap();
        assert_eq!((c.id, c.epoch, c.parent.as_deref()), (2, 2, Some("p")));
        assert_eq!(c.limits, Limits::from_milli(500, 0, 1000).unwrap());
        assert!(store.get("gone".into()).await.unwrap().is_none());
        let changes = store.changes_since(0, 10).await.unwrap();
        assert_eq!(changes.iter().map(|q| q.epoch).collect::<Vec<_>>()[..3], [1, 2, 3]);
        assert!(changes[2].deleted);
        if round == 0 {
            // Writes continue the old epochs and ids.
            let w = store
                .put_many(vec![NewQuota {
                    name: "new".into(),
                    limits: Limits::from_milli(1000, 0, 0).unwrap(),
                    parent: Some("c".into()),
                }])
                .await
                .unwrap();
            assert_eq!((w.base_epoch, w.quotas[0].id, w.quotas[0].epoch), (3, 4, 4));
            store.delete("new".into()).await.unwrap();
        }
    }
}

#[tokio::test]
async fn an_old_sqlite_database_is_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("old.db").display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    for s in OLD_SQLITE {
        sqlx::query(s).execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();
    check_adopted(&url).await;
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let rows: Vec<(i64, String, bool)> =
        sqlx::query_as("SELECT version, description, success FROM _sqlx_migrations")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![
            (1, "adopted from yarl_schema_migrations".into(), true),
            (2, "reset epoch".into(), true),
            (3, "key secret".into(), true),
            (4, "dry run".into(), true),
            (5, "window".into(), true),
            (6, "max in flight".into(), true),
            (7, "parent index".into(), true),
        ],
        "version 1 adopted, the later ones applied"
    );
}

#[tokio::test]
async fn an_old_postgres_database_is_adopted() {
    let Some(base) = pg_url("an_old_postgres_database_is_adopted") else { return };
    let url = fresh_pg_db(&base).await;
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    for s in OLD_POSTGRES {
        sqlx::query(s).execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();
    check_adopted(&url).await;
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let rows: Vec<(i64, bool)> = sqlx::query_as("SELECT version, success FROM _sqlx_migrations")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![(1, true), (2, true), (3, true), (4, true), (5, true), (6, true)],
        "version 1 adopted, the later ones applied"
    );
}

#[tokio::test]
async fn a_database_newer_than_this_root_is_refused() {
    let (_store, url, _dir) = sqlite_store().await;
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (999, 'from the future', TRUE, x'00', 0)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    let Err(e) = db::open(&url).await else { panic!("a newer schema was accepted") };
    let e = e.to_string();
    assert!(e.contains("schema version 999") && e.contains("upgrade yarl-root"), "{e}");
}
