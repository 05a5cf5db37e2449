-- Claims that never read a task before its time has come (issue 14.7, 15.9).
--
-- The claim walks the priority levels of PENDING tasks and reads each level's due rows. Rows
-- due later sat in the same index, so a level that held only future rows was probed all the
-- same: 5,000 future levels cost a claim 47 ms, 300,000 cost 2.2 s; and 1M future rows at a
-- higher priority made the generic plan read the due rows through the due-time index instead
-- (5 ms, flipping with the statistics). Now a PENDING row says whether its time has come:
--   staged  true once the row's time is at most pgtaskd_staging_lead() away (one second), as
--           the database saw it when it wrote the row or staged it since.
-- The claim's index holds only staged rows, so future rows are never in its way, whatever
-- their number or priorities. A trigger keeps the flag right on every write that makes a row
-- PENDING or moves its time, whoever writes (a client, plain SQL, a retry, an operator), and
-- whatever value the writer gave it. Rows whose time comes near are staged by the workers
-- (stage_tasks in queries.sql: when a claim comes up short, and every quarter second while
-- claims come back full), a bounded batch at a time through the index of rows not staged
-- yet, which is one probe when none is near. Staging a second ahead means that on a busy
-- queue a task is in the claim's index before its time comes, and is taken in the seed's
-- order from its first due instant; the claim still checks the time.
--
-- Not marked for older daemons: their claim does not know the flag, and without the index
-- it was written for it would read the table instead of one level's rows.

ALTER TABLE tasks ADD COLUMN staged BOOLEAN NOT NULL DEFAULT true;

CREATE FUNCTION pgtaskd_staging_lead() RETURNS INTERVAL
LANGUAGE sql IMMUTABLE
AS $$ SELECT interval '1 second' $$;

CREATE FUNCTION pgtaskd_stage_row() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    NEW.staged := NEW.scheduled_time <= now() + pgtaskd_staging_lead();
    RETURN NEW;
END
$$;

-- Called only for a PENDING row whose flag is wrong; a due submit evaluates the condition
-- alone (the default is right for it). Not on a change of status: claims, renewals and
-- completions never fire it (with it, evaluating the condition cost every claim and final
-- write about 60 us, a fifth of the statement). A row becomes PENDING again either with a
-- new time (a retry, a reaped lease: they set scheduled_time, which fires it) or with the
-- time and the flag it had when it left PENDING (a release, an operator's retry), which are
-- still right: a claimed row was staged and is due, a row cancelled before it was staged
-- is staged by the claims once its time comes near.
CREATE TRIGGER tasks_stage_on_write
    BEFORE INSERT OR UPDATE OF scheduled_time, staged ON tasks
    FOR EACH ROW
    WHEN (NEW.status = 'PENDING'
          AND NEW.staged IS DISTINCT FROM (NEW.scheduled_time <= now() + pgtaskd_staging_lead()))
    EXECUTE FUNCTION pgtaskd_stage_row();

-- The rows written before the column: the default said staged.
UPDATE tasks SET staged = false
WHERE status = 'PENDING' AND scheduled_time > now() + pgtaskd_staging_lead();

CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_staged_claim_idx
    ON tasks (task_type, priority DESC, scheduled_time, created_at)
    WHERE status = 'PENDING' AND staged;

-- Where the claims find the rows whose time has come.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_unstaged_idx ON tasks (scheduled_time)
    WHERE status = 'PENDING' AND NOT staged;

-- The wake-up for a type whose tasks may be claimed now (migration 0007) counted its due
-- tasks through the claim index: it counts the staged ones, through the new one.
CREATE OR REPLACE FUNCTION pgtaskd_wake_type(p_task_type TEXT) RETURNS BIGINT
LANGUAGE plpgsql
AS $$
DECLARE
    v_due BIGINT;
BEGIN
    SELECT count(*) INTO v_due
    FROM (SELECT 1 FROM tasks AS t
          WHERE t.status = 'PENDING' AND t.staged AND t.task_type = p_task_type
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

DROP INDEX IF EXISTS tasks_pending_claim_idx;
