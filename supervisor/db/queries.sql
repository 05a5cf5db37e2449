-- Every SQL statement pgtaskd runs, as named blocks. Python call sites use the names through
-- supervisor.db.store; nothing else builds SQL. Parameters are psycopg %(name)s placeholders.
-- Every write made by the owner of a claim is conditioned on (id, RUNNING, claimed_by,
-- lease_token): zero rows changed means the claim was lost and the result must be dropped.
-- Only the owner's own final writes leave its token on the row; every other change (cancel,
-- release, rescue, reap, an operator's retry) clears it, so a worker that retried a final
-- write after a dropped connection can tell its own landed write from someone else's.

-- name: claim_task
-- The seed's claim, limited to the task types this worker can run. A RUNNING task whose lease
-- expired was abandoned by a worker that stopped: taking it over counts that lost run as a
-- failed attempt, and once the retries are spent it is left to the reaper to mark FAILED.
WITH claimable_task AS (
    SELECT id
    FROM tasks
    WHERE scheduled_time <= now()
      AND (
        status = 'PENDING'
        OR (
          status = 'RUNNING'
          AND (lease_until IS NULL OR lease_until <= now())
          AND retry_count < max_retries
        )
      )
      AND task_type = ANY(%(task_types)s::text[])
    ORDER BY priority DESC, scheduled_time ASC, created_at ASC
    FOR UPDATE SKIP LOCKED
    LIMIT 1
)
UPDATE tasks AS t
SET
    status = 'RUNNING',
    claimed_by = %(worker_id)s,
    lease_until = now() + (%(lease_seconds)s * interval '1 second'),
    lease_token = nextval('pgtaskd_lease_token_seq'),
    retry_count = CASE WHEN t.status = 'RUNNING' THEN t.retry_count + 1 ELSE t.retry_count END,
    error_message = CASE WHEN t.status = 'RUNNING'
                         THEN 'lease of worker ' || coalesce(t.claimed_by, '?') || ' expired'
                         ELSE t.error_message END,
    attempts = t.attempts + 1,
    started_at = now(),
    updated_at = now()
FROM claimable_task
WHERE t.id = claimable_task.id
RETURNING t.*;

-- name: renew_lease
UPDATE tasks
SET
    lease_until = now() + (%(lease_seconds)s * interval '1 second'),
    updated_at = now()
WHERE id = %(task_id)s
  AND status = 'RUNNING'
  AND claimed_by = %(worker_id)s
  AND lease_token = %(token)s
RETURNING lease_until;

-- name: complete_task
UPDATE tasks
SET
    status = 'COMPLETED',
    claimed_by = NULL,
    lease_until = NULL,
    error_message = NULL,
    finished_at = now(),
    updated_at = now()
WHERE id = %(task_id)s
  AND status = 'RUNNING'
  AND claimed_by = %(worker_id)s
  AND lease_token = %(token)s
RETURNING status, retry_count;

-- name: fail_attempt
-- A failed run: back to PENDING after the backoff, or FAILED once max_retries retries were
-- spent (max_retries 3 means 4 runs in all) or at once when the failure is permanent.
UPDATE tasks AS t
SET
    status = CASE WHEN %(permanent)s OR t.retry_count >= t.max_retries
                  THEN 'FAILED' ELSE 'PENDING' END,
    retry_count = CASE WHEN %(permanent)s OR t.retry_count >= t.max_retries
                       THEN t.retry_count ELSE t.retry_count + 1 END,
    scheduled_time = CASE WHEN %(permanent)s OR t.retry_count >= t.max_retries
                          THEN t.scheduled_time
                          ELSE now() + pgtaskd_backoff(t.retry_count, %(base_delay)s,
                                                       %(max_delay)s, %(jitter)s) END,
    finished_at = CASE WHEN %(permanent)s OR t.retry_count >= t.max_retries
                       THEN now() ELSE NULL END,
    error_message = %(error)s,
    claimed_by = NULL,
    lease_until = NULL,
    updated_at = now()
WHERE t.id = %(task_id)s
  AND t.status = 'RUNNING'
  AND t.claimed_by = %(worker_id)s
  AND t.lease_token = %(token)s
RETURNING t.status, t.retry_count,
          greatest(extract(epoch FROM t.scheduled_time - now()), 0)::float8 AS retry_delay;

-- name: release_task
-- Give a claimed task back without spending a retry: the daemon is stopping, not the task
-- failing. Conditioned on the token like every owner write.
UPDATE tasks
SET
    status = 'PENDING',
    claimed_by = NULL,
    lease_token = NULL,
    lease_until = NULL,
    updated_at = now()
WHERE id = %(task_id)s
  AND status = 'RUNNING'
  AND lease_token = %(token)s
RETURNING status;

-- name: rescue_task
-- The supervisor saw the child holding this claim die: the run counts as a failed attempt at
-- once, instead of after the lease expires. Conditioned on the claim's token only, because
-- the dead child's worker id is the one on the row.
UPDATE tasks AS t
SET
    status = CASE WHEN t.retry_count >= t.max_retries THEN 'FAILED' ELSE 'PENDING' END,
    retry_count = CASE WHEN t.retry_count >= t.max_retries
                       THEN t.retry_count ELSE t.retry_count + 1 END,
    scheduled_time = CASE WHEN t.retry_count >= t.max_retries
                          THEN t.scheduled_time
                          ELSE now() + pgtaskd_backoff(t.retry_count, %(base_delay)s,
                                                       %(max_delay)s, %(jitter)s) END,
    finished_at = CASE WHEN t.retry_count >= t.max_retries THEN now() ELSE NULL END,
    error_message = %(error)s,
    claimed_by = NULL,
    lease_token = NULL,
    lease_until = NULL,
    updated_at = now()
WHERE t.id = %(task_id)s
  AND t.status = 'RUNNING'
  AND t.lease_token = %(token)s
RETURNING t.id, t.task_type, t.status, t.retry_count,
          greatest(extract(epoch FROM t.scheduled_time - now()), 0)::float8 AS retry_delay;

-- name: reap_expired_leases
-- Tasks whose owner stopped renewing (a worker of any daemon that died or was cut off). Safe
-- for many daemons at once: SKIP LOCKED splits the batch and the UPDATE re-checks the lease.
WITH expired AS (
    SELECT id
    FROM tasks
    WHERE status = 'RUNNING'
      AND lease_until <= now()
    ORDER BY lease_until
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
UPDATE tasks AS t
SET
    status = CASE WHEN t.retry_count >= t.max_retries THEN 'FAILED' ELSE 'PENDING' END,
    retry_count = CASE WHEN t.retry_count >= t.max_retries
                       THEN t.retry_count ELSE t.retry_count + 1 END,
    scheduled_time = CASE WHEN t.retry_count >= t.max_retries
                          THEN t.scheduled_time
                          ELSE now() + pgtaskd_backoff(t.retry_count, %(base_delay)s,
                                                       %(max_delay)s, %(jitter)s) END,
    finished_at = CASE WHEN t.retry_count >= t.max_retries THEN now() ELSE NULL END,
    error_message = 'lease of worker ' || coalesce(t.claimed_by, '?')
                    || ' expired: the worker stopped renewing it',
    claimed_by = NULL,
    lease_token = NULL,
    lease_until = NULL,
    updated_at = now()
FROM expired
WHERE t.id = expired.id
  AND t.status = 'RUNNING'
  AND t.lease_until <= now()
RETURNING t.id, t.task_type, t.status, t.retry_count, t.error_message,
          greatest(extract(epoch FROM t.scheduled_time - now()), 0)::float8 AS retry_delay;

-- name: cancel_task
UPDATE tasks
SET
    status = 'CANCELLED',
    claimed_by = NULL,
    lease_token = NULL,
    lease_until = NULL,
    finished_at = now(),
    updated_at = now()
WHERE id = %(task_id)s
  AND status IN ('PENDING', 'RUNNING')
RETURNING id, status;

-- name: get_task
SELECT * FROM tasks WHERE id = %(task_id)s;

-- name: task_status
SELECT status, claimed_by, lease_token, retry_count FROM tasks WHERE id = %(task_id)s;

-- name: insert_task
-- Idempotent submit: an id that exists already inserts nothing and returns no row.
INSERT INTO tasks (id, name, task_type, payload, priority, scheduled_time, max_retries)
VALUES (%(id)s, %(name)s, %(task_type)s, %(payload)s, %(priority)s,
        coalesce(%(scheduled_time)s, now()), %(max_retries)s)
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: queue_health
-- One round trip for the health check, the queue gauges and `pgtaskd stats`.
-- oldest_pending_age is NULL when no due task waits.
SELECT
    (SELECT count(*) FROM tasks WHERE status = 'PENDING' AND scheduled_time <= now())
        AS due_pending,
    (SELECT count(*) FROM tasks
      WHERE status = 'PENDING' AND scheduled_time <= now() - (%(max_pending_age)s * interval '1 second'))
        AS old_pending,
    (SELECT count(*) FROM tasks WHERE status = 'RUNNING' AND lease_until <= now())
        AS expired_leases,
    -- Expired longer than the reaper should ever take to notice: nobody is reaping.
    (SELECT count(*) FROM tasks
      WHERE status = 'RUNNING' AND lease_until <= now() - (%(lease_grace)s * interval '1 second'))
        AS stuck_leases,
    (SELECT extract(epoch FROM now() - min(scheduled_time))::float8 FROM tasks
      WHERE status = 'PENDING' AND scheduled_time <= now())
        AS oldest_pending_age;

-- name: count_by_status
SELECT status, count(*) AS count FROM tasks GROUP BY status;

-- name: submit_tasks
-- The client's submit, for one task or thousands in one statement: the column arrays are
-- unnested side by side, one row per task. ON CONFLICT DO NOTHING makes an id that exists
-- already (or a second copy of an id in the same batch: the first copy wins) insert nothing,
-- so RETURNING lists only the ids this statement created. A concurrent submit of the same id
-- waits for the other transaction and then inserts nothing. A delay counts from the
-- database's clock, never the client's.
INSERT INTO tasks (id, name, task_type, payload, priority, scheduled_time, max_retries)
SELECT batch.id, batch.name, batch.task_type, batch.payload::jsonb, batch.priority,
       coalesce(batch.run_at, now() + coalesce(batch.delay_seconds, 0) * interval '1 second'),
       batch.max_retries
FROM unnest(%(ids)s::text[], %(names)s::text[], %(task_types)s::text[], %(payloads)s::text[],
            %(priorities)s::int[], %(run_ats)s::timestamptz[], %(delays)s::float8[],
            %(max_retries)s::int[])
     WITH ORDINALITY AS batch(id, name, task_type, payload, priority, run_at, delay_seconds,
                              max_retries, position)
ORDER BY batch.position
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: retry_task
-- An operator's retry: a FAILED or CANCELLED task runs again from scratch, with its whole
-- retry budget and no trace of the last failure. attempts keeps counting every run ever made.
UPDATE tasks
SET
    status = 'PENDING',
    retry_count = 0,
    scheduled_time = now(),
    error_message = NULL,
    claimed_by = NULL,
    lease_token = NULL,
    lease_until = NULL,
    finished_at = NULL,
    updated_at = now()
WHERE id = %(task_id)s
  AND status IN ('FAILED', 'CANCELLED')
RETURNING id, status;

-- name: list_tasks
-- Most recently changed first: what an operator looking at the queue wants to see.
SELECT *
FROM tasks
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(task_type)s::text IS NULL OR task_type = %(task_type)s::text)
ORDER BY updated_at DESC, id
LIMIT %(limit)s;

-- name: count_by_type_and_status
SELECT task_type, status, count(*) AS count
FROM tasks
GROUP BY task_type, status
ORDER BY task_type, status;
