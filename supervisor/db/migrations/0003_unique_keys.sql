-- Unique keys: at most one live task per key.
--
-- unique_key: at most one PENDING or RUNNING task holds a key at a time; finished tasks keep
-- theirs (to show where a task came from) without blocking a new one. Nullable and without
-- a default, so adding it rewrites nothing and a plain INSERT that does not name it still
-- makes a valid task, one with no key.
ALTER TABLE tasks ADD COLUMN unique_key TEXT;

-- The partial index is the rule itself, so it holds for every writer: the client, the CLI, a
-- plain INSERT from another language, an operator's UPDATE. Tasks without a key are not in
-- it at all, so it costs the writes of keyless tasks nothing. The client inserts with
-- ON CONFLICT DO NOTHING, which takes this index as an arbiter: a second submit of a live
-- key inserts nothing instead of raising, and so never aborts a caller's transaction.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS tasks_live_unique_key_idx ON tasks (unique_key)
    WHERE status IN ('PENDING', 'RUNNING') AND unique_key IS NOT NULL;
