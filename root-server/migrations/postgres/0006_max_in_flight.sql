-- Concurrency quotas ("max_in_flight": C): at most C requests of the quota in flight at
-- once across the cluster. 0 is no such cap, as every quota written before this column.
ALTER TABLE yarl_quotas ADD COLUMN max_in_flight BIGINT NOT NULL DEFAULT 0;
