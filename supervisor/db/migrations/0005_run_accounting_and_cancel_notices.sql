-- What each run cost, and a notice when a running task is cancelled.

-- The CPU time (user + system, the worker process and what it started and waited for) and
-- the peak resident memory of the task's latest run, written with its final state.
ALTER TABLE tasks ADD COLUMN cpu_seconds DOUBLE PRECISION;
ALTER TABLE tasks ADD COLUMN peak_rss_bytes BIGINT;

-- A running task that is cancelled: daemons whose handlers for its type are configured with
-- `cancel: kill` stop the child running it at once, instead of at its next lease renewal.
-- The payload carries the task id, within pg_notify's limit (a task whose id is too long for
-- it is found at its next lease renewal instead): nothing here may fail the cancel.
CREATE FUNCTION pgtaskd_notify_cancelled() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_payload TEXT := json_build_object('cancelled', NEW.id, 'schema', TG_TABLE_SCHEMA)::text;
BEGIN
    IF octet_length(v_payload) < 7900 THEN
        PERFORM pg_notify('pgtaskd_tasks', v_payload);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tasks_notify_cancelled
    AFTER UPDATE OF status ON tasks
    FOR EACH ROW
    WHEN (OLD.status = 'RUNNING' AND NEW.status = 'CANCELLED')
    EXECUTE FUNCTION pgtaskd_notify_cancelled();
