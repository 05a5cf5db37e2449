-- Global concurrency limits: at most max_running tasks of a type RUNNING under a live lease,
-- across every daemon on every host.
--
-- A limit of N is N slot rows. A claim of a limited type must take a free slot in the same
-- statement, and a slot is free only by what its own row says (no task holds it, or its
-- lease ran out): a claimer that locks a slot another claimer has just taken re-reads the
-- row (READ COMMITTED's recheck of a locked row) and sees it taken. Counting RUNNING tasks
-- instead would be racy: two claims that start together both count from a snapshot taken
-- before either commits, and both take the last place.
-- A slot's lease moves with its task's: set by the claim, extended by the same statement that
-- renews the task's lease, given back by the owner's final write. A holder killed with -9
-- gives nothing back; its slot is free again when its lease runs out, as its task is.
CREATE TABLE task_type_limits (
    task_type TEXT PRIMARY KEY,
    max_running INTEGER NOT NULL CHECK (max_running > 0),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Who set it (a daemon's name, or the operator's CLI), for whoever wonders why.
    updated_by TEXT
);

-- Slots above max_running (a lowered limit) are never taken again; a held one stays until its
-- task ends, so lowering a limit stops no running task, and the next apply deletes it.
-- Every claim, renewal and final write of a limited task updates its slot's row: rows are
-- found by primary key (a task row names its slot), no other column is indexed, and pages are
-- left half empty, so that each update is a HOT update that writes no index entry.
CREATE TABLE task_type_slots (
    task_type TEXT NOT NULL,
    slot INTEGER NOT NULL CHECK (slot > 0),
    task_id TEXT,
    lease_token BIGINT,
    lease_until TIMESTAMPTZ,
    PRIMARY KEY (task_type, slot)
) WITH (fillfactor = 50);

-- The slot a claim took, if its type was limited then: a renewal keeps the task's lease only
-- while its slot is still its own (a lease that lapsed and came back late must not run beside
-- the task that took its slot meanwhile). NULL for a claim made while its type had no limit,
-- which then renews as before.
ALTER TABLE tasks ADD COLUMN slot INTEGER;

-- Wake idle workers for a task type whose tasks may be claimed now (a pause lifted, a limit
-- raised or removed): notify pgtaskd_tasks as the triggers of migration 0002 do, with how
-- many of its tasks are due, counted through the claim index up to 1,000 (the relay wakes at
-- most that many idle workers, never more than it has, and counting a backlog of millions
-- would cost more than it tells). Nothing is sent when none is due: tasks due later are found
-- by the relay's timers or the workers' polls. Like the triggers', the notification goes out
-- when the transaction commits. Returns the count.
CREATE FUNCTION pgtaskd_wake_type(p_task_type TEXT) RETURNS BIGINT
LANGUAGE plpgsql
AS $$
DECLARE
    v_due BIGINT;
BEGIN
    SELECT count(*) INTO v_due
    FROM (SELECT 1 FROM tasks AS t
          WHERE t.status = 'PENDING' AND t.task_type = p_task_type
            AND t.scheduled_time <= now()
          LIMIT 1000) AS capped;
    IF v_due > 0 THEN
        PERFORM pg_notify('pgtaskd_tasks', pgtaskd_wakeup_payload(
            (SELECT n.nspname FROM pg_class AS c
               JOIN pg_namespace AS n ON n.oid = c.relnamespace
              WHERE c.oid = 'tasks'::regclass),
            ARRAY[p_task_type], v_due, NULL));
    END IF;
    RETURN v_due;
END
$$;
