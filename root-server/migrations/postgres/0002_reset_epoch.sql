-- Cluster-wide resets (POST /v1/quotas/{name}:reset): the epoch of the quota's last reset,
-- 0 if never. A reset is a write like any other (a new epoch on the row) that also sets
-- this column to that epoch; roots and limiters empty the counter when they apply it.
ALTER TABLE yarl_quotas ADD COLUMN reset_epoch BIGINT NOT NULL DEFAULT 0;
