-- Bulk retry, cancel and purge by filter (issue 17.3), in bounded batches.
-- pgtaskd: older daemons may run on this
--
-- A bulk action walks the tasks of one status and one task type in a fixed order, a batch of
-- at most N rows per statement, each batch starting after the last row of the one before (a
-- keyset: never OFFSET, so the millionth row costs what the first does). The order needs a
-- unique tail (the id): a submit_many or a catch-up writes thousands of rows with the same
-- timestamps, and an order with ties would read a whole group of them again in every batch.
-- No index served such a walk by type: tasks_finished_idx is (status, finished_at), with no
-- type, and the claim's indexes hold PENDING rows by priority, in two halves (staged or not),
-- without the id. Reading by status alone, `purge --type report` among five million finished
-- tasks of other types would read all five million.
--
-- Only indexes: daemons of the previous version never read them.

-- Retry and purge walk finished tasks by when they finished. A row marked finished by hand
-- without a finished_at is taken as finished at its updated_at, as retention ages it, so that
-- the key is never NULL (a keyset cannot step over NULLs). Each row enters this index once,
-- when it finishes (rows leave it when retried or deleted).
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_finished_walk_idx
    ON tasks (status, task_type, (coalesce(finished_at, updated_at)), id)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');

-- Cancel walks PENDING tasks by when they were submitted: created_at never changes, so a
-- row cannot move behind the walk while it runs (scheduled_time can: a retry or a backoff
-- moves it).
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_pending_walk_idx
    ON tasks (task_type, created_at, id)
    WHERE status = 'PENDING';
