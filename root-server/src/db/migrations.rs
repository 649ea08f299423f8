//! Schema migrations, numbered, embedded in the binary, applied in order at start.
//!
//! Each database records the versions it has in `yarl_schema_migrations`; a root refuses to
//! start on a schema newer than it knows, so an old binary never writes into a newer layout.
//! Append new migrations; never edit an applied one.
//!
//! Amounts are `BIGINT` milli-units (see `yarl_core::units`): exact, and every accepted value
//! fits. PostgreSQL names use the "C" collation so that list order and prefix ranges are
//! bytewise, the same as SQLite's default.

/// One schema step.
#[derive(Debug)]
pub(super) struct Migration {
    pub version: i64,
    pub description: &'static str,
    pub statements: &'static [&'static str],
}

pub(super) const SQLITE: &[Migration] = &[Migration {
    version: 1,
    description: "quotas with epochs and tombstones",
    statements: &[
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
    ],
}];

pub(super) const POSTGRES: &[Migration] = &[Migration {
    version: 1,
    description: "quotas with epochs and tombstones",
    statements: &[
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
    ],
}];

pub(super) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS yarl_schema_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL
)";

/// The migrations still to apply given the highest applied version, or an error if the
/// database is newer than this binary.
pub(super) fn pending(
    all: &'static [Migration],
    applied: Option<i64>,
) -> Result<&'static [Migration], String> {
    let applied = applied.unwrap_or(0);
    let known = all.last().map_or(0, |m| m.version);
    if applied > known {
        return Err(format!(
            "schema version {applied} is newer than this yarl-root knows ({known}); upgrade yarl-root"
        ));
    }
    Ok(&all[all.iter().take_while(|m| m.version <= applied).count()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_increase_and_pending_is_a_suffix() {
        for all in [SQLITE, POSTGRES] {
            assert!(all.windows(2).all(|w| w[0].version < w[1].version));
            assert_eq!(pending(all, None).unwrap().len(), all.len());
            assert!(pending(all, Some(all.last().unwrap().version)).unwrap().is_empty());
            assert!(pending(all, Some(999)).unwrap_err().contains("newer"));
        }
    }
}
