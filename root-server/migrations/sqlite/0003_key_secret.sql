-- Settings of the cluster, one row each. `key_secret`: 32 hex digits, the key the wire ids
-- of keys (names under templates) are derived with; every root of the database hands it to
-- its limiters, so every limiter of the cluster gives a name the same id. Random, made once.
CREATE TABLE yarl_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO yarl_settings (name, value) VALUES ('key_secret', lower(hex(randomblob(16))));
