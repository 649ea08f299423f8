-- The parent index's condition in the words the queries use (`NOT deleted`): SQLite takes a
-- partial index only when the query names each term of its WHERE, so `deleted = 0` made
-- every lookup of a quota's children (each PUT and DELETE) scan the whole table.
DROP INDEX yarl_quotas_parent;
CREATE INDEX yarl_quotas_parent ON yarl_quotas (parent)
    WHERE parent IS NOT NULL AND NOT deleted;
