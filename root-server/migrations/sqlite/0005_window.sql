-- Windows ("per": "1h"): `limit_milli` counts per `per_s` seconds. Every quota written
-- before this column is per second, as it was.
ALTER TABLE yarl_quotas ADD COLUMN per_s INTEGER NOT NULL DEFAULT 1;
