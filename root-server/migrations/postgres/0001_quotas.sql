-- Quotas with epochs and tombstones (see src/db/mod.rs). Amounts are BIGINT milli-units;
-- names use the "C" collation so list order and prefix ranges are bytewise, as in SQLite.
-- Identical to version 1 of the hand-written runner this folder replaced, so databases it
-- created are adopted as at version 1 (src/db/migrate.rs).
CREATE TABLE yarl_quotas (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name TEXT COLLATE "C" NOT NULL UNIQUE,
    limit_milli BIGINT NOT NULL,
    low_burst_milli BIGINT NOT NULL,
    high_burst_milli BIGINT NOT NULL,
    parent TEXT COLLATE "C",
    epoch BIGINT NOT NULL UNIQUE,
    deleted BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX yarl_quotas_parent ON yarl_quotas (parent)
    WHERE parent IS NOT NULL AND NOT deleted;
CREATE TABLE yarl_epoch (id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL);
INSERT INTO yarl_epoch (id, epoch) VALUES (1, 0);
