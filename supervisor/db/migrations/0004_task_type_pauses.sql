-- Task types paused fleet-wide.
--
-- The task types no daemon may claim. The claim (complete_and_claim) reads this table in the
-- same statement, so a pause holds for every daemon from their next claim on, with no restart
-- and nothing for the daemons to watch; resuming deletes the row (and notifies, so that idle
-- workers start the waiting tasks at once). Tasks already claimed run to their end.
CREATE TABLE task_type_pauses (
    task_type TEXT PRIMARY KEY,
    paused_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Who paused it, for the operator who wonders why a queue stands still.
    paused_by TEXT
);
