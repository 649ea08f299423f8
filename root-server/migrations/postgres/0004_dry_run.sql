-- Shadow mode ("dry_run": true): limiters decide and count what the quota would reject but
-- let it through. Every quota written before this column enforces, as it did.
ALTER TABLE yarl_quotas ADD COLUMN dry_run BOOLEAN NOT NULL DEFAULT FALSE;
