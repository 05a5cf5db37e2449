-- Claims whose cost stays flat as the table grows and skews, batch claims, and wake-ups.
--
-- The first claim index covered RUNNING rows and started with priority, so a claim read
-- through every live lease, every future task of a higher priority and every due task of a
-- type the worker does not run before it found its own. Now the claim (complete_and_claim in
-- queries.sql) reads, per task type it runs, one priority level at a time (a loose index
-- scan), and only PENDING rows are in its index.
--
-- Each index is built CONCURRENTLY, alone, outside the migration's transactions (migrate.py):
-- a plain build would stop every write to a live table while it reads it. The old indexes
-- are dropped once their replacements exist, so claims never go without one.

-- The claim: per type, per priority level, the due rows in the seed's order.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_pending_claim_idx
    ON tasks (task_type, priority DESC, scheduled_time, created_at)
    WHERE status = 'PENDING';
DROP INDEX tasks_claim_order_idx;

-- Due-time questions about the whole queue (the health check's oldest pending task, the
-- number of due tasks) without reading future tasks or finished ones.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_pending_due_idx ON tasks (scheduled_time) WHERE status = 'PENDING';

-- Retention deletes old finished tasks by status and age; operators list them the same way.
-- It replaces the (status, task_type) index, which every state change of every task had to
-- update.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_finished_idx ON tasks (status, finished_at)
    WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED');
DROP INDEX tasks_status_type_idx;

-- Wake-ups. Idle workers wait for a notification on the channel pgtaskd_tasks instead of
-- only polling, whoever makes a task due: pgtaskd's client, a plain INSERT from another
-- language, a retry, a release, an operator's UPDATE. The payload is a small JSON object:
--   types  the task types concerned, or null for "any" (too many, or too long, to list)
--   due    how many of them are due now
--   delay  seconds until the earliest one that is not due yet, or null
-- Notifications are hints: a missed one costs at most a poll interval. Nothing here may make
-- the INSERT or UPDATE that fires it fail, so every value is bounded before it is sent.
--   schema the schema of the tasks table: the channel is shared by the whole database, and a
--          daemon ignores what concerns another schema's table (pgtaskd bench uses one)
CREATE FUNCTION pgtaskd_wakeup_payload(p_schema TEXT, p_types TEXT[], p_due BIGINT,
                                       p_next TIMESTAMPTZ)
RETURNS TEXT
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_delay DOUBLE PRECISION;
    v_payload TEXT;
BEGIN
    IF p_next IS NOT NULL AND isfinite(p_next) AND p_next > now() THEN
        v_delay := least(extract(epoch FROM p_next - now()), 31536000);
    END IF;
    v_payload := json_build_object('types', CASE WHEN cardinality(p_types) <= 32 THEN p_types END,
                                   'due', p_due, 'delay', v_delay, 'schema', p_schema)::text;
    -- pg_notify refuses payloads of 8000 bytes or more; long type names fall back to "any".
    IF octet_length(v_payload) >= 7900 THEN
        v_payload := json_build_object('types', NULL, 'due', p_due, 'delay', v_delay,
                                       'schema', p_schema)::text;
    END IF;
    RETURN v_payload;
END
$$;

CREATE FUNCTION pgtaskd_notify_inserted() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_types TEXT[];
    v_due BIGINT;
    v_next TIMESTAMPTZ;
BEGIN
    SELECT array_agg(DISTINCT task_type),
           count(*) FILTER (WHERE scheduled_time <= now()),
           min(scheduled_time) FILTER (WHERE scheduled_time > now() AND isfinite(scheduled_time))
      INTO v_types, v_due, v_next
    FROM inserted_tasks
    WHERE status = 'PENDING';
    IF v_due > 0 OR v_next IS NOT NULL THEN
        PERFORM pg_notify('pgtaskd_tasks',
                         pgtaskd_wakeup_payload(TG_TABLE_SCHEMA, v_types, v_due, v_next));
    END IF;
    RETURN NULL;
END
$$;

-- Statement level: a submit_many of 10,000 rows sends one notification, not 10,000.
CREATE TRIGGER tasks_wakeup_on_insert
    AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS inserted_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtaskd_notify_inserted();

CREATE FUNCTION pgtaskd_notify_pending() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify('pgtaskd_tasks', pgtaskd_wakeup_payload(
        TG_TABLE_SCHEMA,
        ARRAY[NEW.task_type],
        CASE WHEN NEW.scheduled_time <= now() THEN 1 ELSE 0 END,
        NEW.scheduled_time));
    RETURN NULL;
END
$$;

-- Row level, but only for rows that become PENDING (a retry, a release, a requeue, an
-- operator's retry or reschedule): claims, renewals and completions never call it.
-- Identical payloads in one transaction are folded into one notification by PostgreSQL.
CREATE TRIGGER tasks_wakeup_on_pending
    AFTER UPDATE OF status, scheduled_time ON tasks
    FOR EACH ROW
    WHEN (NEW.status = 'PENDING'
          AND (OLD.status <> 'PENDING' OR OLD.scheduled_time IS DISTINCT FROM NEW.scheduled_time))
    EXECUTE FUNCTION pgtaskd_notify_pending();
