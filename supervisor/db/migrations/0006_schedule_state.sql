-- Periodic tasks (schedules: in the YAML). Every daemon enqueues each schedule's due instants
-- as tasks whose ids name the instant (schedule:<name>:<instant>), so no leader is needed and
-- no instant is enqueued twice. What the tasks cannot tell the daemons is what was missed
-- while none ran: retention deletes finished tasks, and an operator may delete others, so
-- "the newest task of this schedule" would forget a run and repeat it. This table keeps it:
-- one row per schedule name, written in the same transaction as the tasks it accounts for.
-- (Migration 0003 belongs to another branch; versions are applied by number, whatever order
-- they arrive in.)
CREATE TABLE pgtaskd_schedule_state (
    name TEXT PRIMARY KEY,
    -- The expression and zone that "through" was reached with: a schedule whose cron or time
    -- zone changes starts afresh rather than catching up on the old expression's instants.
    cron TEXT NOT NULL,
    timezone TEXT NOT NULL,
    -- Every instant up to this one was handled: enqueued, or passed over by the catch-up
    -- policy. Only moves forward while cron and timezone stay the same (greatest()).
    through TIMESTAMPTZ NOT NULL,
    -- The newest instant enqueued and its task's id, for `pgtaskd schedules`.
    last_enqueued TIMESTAMPTZ,
    last_task_id TEXT,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
