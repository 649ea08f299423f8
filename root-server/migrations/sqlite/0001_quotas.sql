-- Quotas with epochs and tombstones (see src/db/mod.rs). Amounts are BIGINT milli-units.
-- Identical to version 1 of the hand-written runner this folder replaced, so databases it
-- created are adopted as at version 1 (src/db/migrate.rs).
CREATE TABLE yarl_quotas (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    limit_milli INTEGER NOT NULL,
    low_burst_milli INTEGER NOT NULL,
    high_burst_milli INTEGER NOT NULL,
    parent TEXT,
    epoch INTEGER NOT NULL UNIQUE,
    deleted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX yarl_quotas_parent ON yarl_quotas (parent)
    WHERE parent IS NOT NULL AND deleted = 0;
CREATE TABLE yarl_epoch (id INTEGER PRIMARY KEY CHECK (id = 1), epoch INTEGER NOT NULL);
INSERT INTO yarl_epoch (id, epoch) VALUES (1, 0);
