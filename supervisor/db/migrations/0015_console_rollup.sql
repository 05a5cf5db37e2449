-- The web console (pgtaskd web): a per-minute rollup of the queue, and per type the tasks
-- due later (issue 17.4).
-- pgtaskd: older daemons may run on this
--
-- Older daemons never read nor write either: they only pay the index's entry for each task
-- submitted for later, and their rollups are simply missing (daemons of this version write
-- them).
--
-- One row per minute and task type, written once a minute by a daemon's rollup service
-- (maintenance/rollup.py, rollup_minutes in queries.sql), so that the console's charts and
-- its "failed in 24 h" and "completed in 1 h" read a few hundred small rows instead of the
-- tasks table. The row of task type '' (no task type can be empty) is the whole queue's,
-- and marks the minute as rolled up.
CREATE TABLE pgtaskd_minute_rollup (
    minute TIMESTAMPTZ NOT NULL,
    task_type TEXT NOT NULL,
    -- Tasks that became COMPLETED or FAILED within the minute (by finished_at).
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    -- Due PENDING tasks when the minute was rolled up, counted up to a cap (due_at_least:
    -- the count stopped), and RUNNING ones; NULL for a minute rolled up late (after an
    -- outage of every daemon), whose queue nobody saw.
    due INTEGER,
    due_at_least BOOLEAN NOT NULL DEFAULT false,
    running INTEGER,
    PRIMARY KEY (minute, task_type)
);

-- The PENDING tasks of one type due later, in time order: the console lists them after the
-- due ones and counts them per type. The claim's own index of the unstaged rows (migration
-- 0010) has no task type, so a type's future tasks would be found only by reading every
-- other type's. A task enters it only when it is submitted for later, and leaves it when it
-- is staged.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_future_type_idx
    ON tasks (task_type, scheduled_time)
    WHERE status = 'PENDING' AND NOT staged;
