-- pgtaskd: older daemons may run on this
-- The history of each task's failed attempts (issue 17.1): when, which worker, how the run
-- ended, the exception's type and message and its traceback. A daemon of the previous
-- version runs correctly on it: it never reads the table, its retention's deletes take the
-- rows with them (the foreign key), and a claim of its that takes over a lapsed lease is
-- recorded by the trigger below; only the failures it writes itself go unrecorded.
--
-- Only failures pay. The failure statements insert their attempt themselves (fail_attempt,
-- rescue_task, reap_expired_leases); a claim's takeover of a RUNNING task whose lease ran
-- out is recorded by a trigger instead, so that the claim statements keep their plans: its
-- condition is a few comparisons per row a claim or a completion writes, and its function
-- runs for a takeover only.

CREATE TABLE task_attempts (
    task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    -- Orders a task's attempts (the run number below may be any value a client wrote).
    id BIGINT GENERATED ALWAYS AS IDENTITY,
    -- The run's number: the task's attempts when it ended (1 for its first run).
    attempt INTEGER,
    worker_id TEXT,
    started_at TIMESTAMPTZ,
    ended_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- exception: the handler raised, and the task may run again; permanent: it raised
    -- PermanentError, or the worker could not run it (no retry); timeout: it ran past its
    -- type's timeout (killed, or it stopped when told); killed: the supervisor killed its
    -- child for another reason (reload_timeout, a closed link); crashed: its child died
    -- (signal, when a signal killed it); lease_lost: its lease ran out (reaped, or taken
    -- over by another worker's claim).
    outcome TEXT NOT NULL
        CONSTRAINT task_attempts_outcome_check
        CHECK (outcome IN ('exception', 'permanent', 'timeout', 'killed', 'crashed',
                           'lease_lost')),
    error_type TEXT,
    message TEXT,
    -- As the worker formatted it, at most 16 KiB: its head and its tail.
    traceback TEXT,
    -- The signal that ended the run's child (SIGKILL, ...), if one did.
    signal TEXT,
    -- Serves a task's history, newest first, and the foreign key's deletes.
    PRIMARY KEY (task_id, id)
);

-- The last 20 attempts of a task are kept: each insert deletes what falls beyond them, in
-- the statement that inserts (an AFTER trigger sees the rows inserted before it).
CREATE FUNCTION pgtaskd_keep_last_attempts() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM task_attempts AS a
    WHERE a.task_id = NEW.task_id
      AND a.id < (SELECT kept.id FROM task_attempts AS kept
                   WHERE kept.task_id = NEW.task_id
                   ORDER BY kept.id DESC
                   OFFSET 19 LIMIT 1);
    RETURN NULL;
END
$$;

CREATE TRIGGER task_attempts_keep_last
    AFTER INSERT ON task_attempts
    FOR EACH ROW
    EXECUTE FUNCTION pgtaskd_keep_last_attempts();

-- A claim took over a RUNNING task whose lease had run out (complete_and_claim's expired
-- path): the run it ended lost its lease. OLD is that run's row.
CREATE FUNCTION pgtaskd_record_takeover() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO task_attempts (task_id, attempt, worker_id, started_at, outcome, message)
    VALUES (NEW.id, OLD.attempts, OLD.claimed_by, OLD.started_at, 'lease_lost',
            'lease of worker ' || coalesce(OLD.claimed_by, '?') || ' expired: taken over by '
            || coalesce(NEW.claimed_by, '?'));
    RETURN NULL;
END
$$;

-- Only a claim writes a new token on a row that stays RUNNING.
CREATE TRIGGER tasks_record_takeover
    AFTER UPDATE OF lease_token ON tasks
    FOR EACH ROW
    WHEN (OLD.status = 'RUNNING' AND NEW.status = 'RUNNING'
          AND OLD.lease_token IS DISTINCT FROM NEW.lease_token)
    EXECUTE FUNCTION pgtaskd_record_takeover();
