-- Every SQL statement pgtaskd runs, as named blocks. Python call sites use the names through
-- supervisor.db.store; nothing else builds SQL. Parameters are psycopg %(name)s placeholders.
-- Every write made by the owner of a claim is conditioned on (id, RUNNING, claimed_by,
-- lease_token): zero rows changed means the claim was lost and the result must be dropped.
-- Only the owner's own final writes leave its token on the row; every other change (cancel,
-- release, rescue, reap, an operator's retry) clears it, so a worker that retried a final
-- write after a dropped connection can tell its own landed write from someone else's.

-- name: complete_and_claim
-- (complete_and_claim_limited, below, is the same with global concurrency limits: store.py
-- runs this one while none of the worker's types has a limit, because every node a plan
-- holds costs its executor start-up on every call, and the slots' part of the plan made the
-- claim a fifth slower for everyone, limits or not.)
-- The worker's loop in one statement, one round trip and one commit: record the completions
-- of the tasks it just ran, then claim up to %(limit)s due tasks of its types. With no
-- completions it is the claim alone; with no types and a limit of 0, the completions alone.
--
-- done: each completion conditioned on its owner and its own fencing token (found by primary
--   key, matched to its token, CPU time and peak memory by its place in the arrays). The token stays on the row, so a
--   worker that retries after a lost answer can tell its own landed write from a loss.
-- unpaused: the worker's task types less those paused (task_type_pauses), so that a pause
--   holds for every daemon from its next claim on, and a paused type's rows, however many are
--   due, are never read: its type is gone before the index is probed.
-- wanted: those types, or none at all when one of them has a global limit
--   (task_type_limits): only complete_and_claim_limited may claim a limited type, and
--   claiming the others here would put them ahead of its more urgent tasks; the last row of
--   the answer says so, and store.py runs that statement in this one's place.
--   Materialized: the three places that use it read the tables once.
-- given_back: the slots (limited types) that the completed tasks held, freed: a worker whose
--   types lost their limit while it ran one still gives its slot back here.
-- levels: the priority levels that hold PENDING tasks of these types, highest first, one
--   index probe per type and level (a loose index scan), read only as far as needed.
-- pending: each level's due tasks in the seed's order (scheduled_time, created_at), locked
--   with SKIP LOCKED as they are read. Future tasks, other types' tasks, RUNNING and finished
--   rows are never read row by row, so the claim costs the same whatever the table holds.
-- expired: RUNNING tasks whose lease ran out, which the seed's claim takes over too (through
--   the lease index, which holds only RUNNING rows). Taking one over counts the lost run as a
--   failed attempt; with its retries spent it is left to the reaper to mark FAILED. Never a
--   task that done completes in this very statement, nor one of a paused type (the reaper
--   returns those to PENDING, where they wait).
-- chosen: both in the seed's order: priority DESC, scheduled_time, created_at, from the
--   values the two paths read already.
-- The claimed rows are reached by primary key (id = ANY(ARRAY(...))): the plan is prepared
-- once per connection, and a generic plan that joins instead may read the whole table.
-- Rows come back with completed = true (one per landed token) or false (a claimed task, its
-- payload as text and infinite timestamps as NULL, so that whatever a client stored the
-- worker decodes it itself and can fail the task cleanly; position is the order to run in).
WITH RECURSIVE
done AS (
    UPDATE tasks AS t
    SET
        status = 'COMPLETED',
        claimed_by = NULL,
        lease_until = NULL,
        error_message = NULL,
        finished_at = now(),
        updated_at = now(),
        cpu_seconds = usage.cpu,
        peak_rss_bytes = usage.rss
    FROM unnest(%(done_ids)s::text[], %(done_tokens)s::bigint[], %(done_cpu)s::float8[],
                %(done_rss)s::bigint[]) AS usage(id, token, cpu, rss)
    WHERE t.id = ANY(%(done_ids)s::text[])
      AND t.id = usage.id
      AND t.lease_token = usage.token
      AND t.status = 'RUNNING'
      AND t.claimed_by = %(worker_id)s
    RETURNING t.id, t.lease_token, t.task_type, t.slot
),
unpaused(task_type) AS MATERIALIZED (
    SELECT requested.task_type
    FROM unnest(%(task_types)s::text[]) AS requested(task_type)
    WHERE NOT EXISTS (SELECT 1 FROM task_type_pauses AS paused
                      WHERE paused.task_type = requested.task_type)
),
wanted(task_type) AS MATERIALIZED (
    SELECT unpaused.task_type FROM unpaused
    WHERE NOT EXISTS (SELECT 1 FROM unpaused AS asked
                      JOIN task_type_limits AS l ON l.task_type = asked.task_type)
),
levels(priority) AS (
    SELECT max(top.priority)
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT t.priority FROM tasks AS t
        WHERE t.status = 'PENDING' AND t.staged AND t.task_type = wanted.task_type
        ORDER BY t.priority DESC
        LIMIT 1) AS top
  UNION ALL
    SELECT (SELECT max(top.priority)
            FROM wanted
            CROSS JOIN LATERAL (
                SELECT t.priority FROM tasks AS t
                WHERE t.status = 'PENDING' AND t.staged AND t.task_type = wanted.task_type
                  AND t.priority < levels.priority
                ORDER BY t.priority DESC
                LIMIT 1) AS top)
    FROM levels
    WHERE levels.priority IS NOT NULL
),
pending AS (
    SELECT due.id, levels.priority, due.scheduled_time, due.created_at
    FROM levels
    CROSS JOIN LATERAL (
        SELECT level_rows.id, level_rows.scheduled_time, level_rows.created_at
        FROM wanted
        CROSS JOIN LATERAL (
            SELECT t.id, t.scheduled_time, t.created_at FROM tasks AS t
            WHERE t.status = 'PENDING' AND t.staged AND t.task_type = wanted.task_type
              -- A range, not "=", and the index's order in full: with an equality the
              -- order is time alone, which the due-time index gives too, and the generic
              -- plan could read the level there, every older due row of any level first.
              AND t.priority >= levels.priority AND t.priority <= levels.priority
            ORDER BY t.priority DESC, t.scheduled_time, t.created_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED) AS level_rows
        ORDER BY level_rows.scheduled_time, level_rows.created_at
        LIMIT %(limit)s) AS due
    -- A staged row may be up to the staging lead early. Checked here, after each level's
    -- rows were read in time order (its due ones first), not in the index probe: a due time
    -- there lets the generic plan read every due row through the due index instead.
    WHERE levels.priority IS NOT NULL AND due.scheduled_time <= now()
    LIMIT %(limit)s
),
expired AS (
    SELECT t.id, t.priority, t.scheduled_time, t.created_at FROM tasks AS t
    WHERE t.status = 'RUNNING'
      AND t.lease_until <= now()
      AND t.task_type = ANY(ARRAY(SELECT task_type FROM wanted))
      AND t.retry_count < t.max_retries
      AND NOT t.id = ANY(%(done_ids)s::text[])
    ORDER BY t.lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
chosen AS (
    SELECT both_paths.id
    FROM (SELECT * FROM pending UNION ALL SELECT * FROM expired) AS both_paths
    ORDER BY both_paths.priority DESC, both_paths.scheduled_time, both_paths.created_at
    LIMIT %(limit)s
),
claimed AS (
    UPDATE tasks AS t
    SET
        status = 'RUNNING',
        claimed_by = %(worker_id)s,
        lease_until = now() + (%(lease_seconds)s * interval '1 second'),
        lease_token = nextval('pgtaskd_lease_token_seq'),
        -- Cannot overflow: expired takes only rows with retry_count < max_retries.
        retry_count = CASE WHEN t.status = 'RUNNING' THEN t.retry_count + 1 ELSE t.retry_count END,
        error_message = CASE WHEN t.status = 'RUNNING'
                             THEN 'lease of worker ' || coalesce(t.claimed_by, '?') || ' expired'
                             ELSE t.error_message END,
        -- Saturates: a count any client may have set to the INTEGER maximum must not
        -- abort the claim of every other task with it.
        attempts = CASE WHEN t.attempts < 2147483647 THEN t.attempts + 1
                        ELSE t.attempts END,
        started_at = now(),
        updated_at = now(),
        slot = NULL
    WHERE t.id = ANY(ARRAY(SELECT id FROM chosen))
    RETURNING t.*
),
given_back AS (
    UPDATE task_type_slots AS s
    SET task_id = NULL, lease_token = NULL, lease_until = NULL
    FROM done
    WHERE s.task_type = done.task_type AND s.slot = done.slot
      AND s.lease_token = done.lease_token
    RETURNING s.lease_token
)
SELECT TRUE AS completed, NULL::text AS id, NULL::text AS name, NULL::text AS task_type,
       NULL::text AS payload, NULL::integer AS priority, NULL::integer AS retry_count,
       NULL::integer AS max_retries, NULL::integer AS attempts, done.lease_token,
       NULL::timestamptz AS scheduled_time, NULL::timestamptz AS created_at,
       NULL::bigint AS position, NULL::text AS signal
FROM done
UNION ALL
SELECT FALSE, c.id, c.name, c.task_type, c.payload::text, c.priority, c.retry_count,
       c.max_retries, c.attempts, c.lease_token,
       CASE WHEN isfinite(c.scheduled_time) THEN c.scheduled_time END,
       CASE WHEN isfinite(c.created_at) THEN c.created_at END,
       row_number() OVER (ORDER BY c.priority DESC, c.scheduled_time, c.created_at), NULL
FROM claimed AS c
UNION ALL
-- One row more when a limit binds one of the worker's unpaused types: store.py then uses
-- complete_and_claim_limited from the next claim on (and in this one's place).
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'limited'
WHERE EXISTS (SELECT 1 FROM unpaused JOIN task_type_limits AS l USING (task_type))
UNION ALL
-- One row more for each completed claim whose task row names a slot that given_back did not
-- free: the slot's row changed after this statement's snapshot (a limit's setter gave the
-- running task that slot, adopt_running_tasks, and this statement waited for that task's
-- row), so it cannot see it. store.py gives it back right after (end_lost_claims).
SELECT NULL, done.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, done.lease_token, NULL, NULL,
       NULL, 'kept'
FROM done
WHERE done.slot IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM given_back WHERE given_back.lease_token = done.lease_token);

-- name: complete_and_claim_limited
-- complete_and_claim with global concurrency limits (migration 0007), for a worker one of
-- whose types has a limit: the same statement, plus
-- free_slots: for each of the worker's unpaused types with a limit (task_type_limits),
--   up to %(limit)s of its free slots, locked with SKIP LOCKED: a slot no task holds, whose
--   lease ran out, or that one of the tasks done completes held. Free by the slot row alone,
--   so that a slot another claim took since this statement began is skipped by the recheck
--   of the locked row, never counted free from an old snapshot. It reads done's tokens, so
--   done has locked (or waited for) its task rows before any slot row is locked: every
--   statement locks a task's row before its slot's, and none waits in a cycle.
-- wanted: each type with how many of its tasks this claim may take (cap): %(limit)s, or for a
--   limited type the free slots it locked; a type with none is left out before its index is
--   probed, so a full type's backlog neither is read nor crowds out the others.
-- chosen: each type's first cap of them (n counts within the type, in the seed's order).
-- placed: each chosen task of a limited type with the slot it takes (its n-th free slot).
-- taken / given_back: the slots now held by the claims, and the slots of the completed tasks
--   that no claim took over, freed. given_back waits for a slot row another statement holds
--   (a renewal) rather than skip it: a skipped one stayed held by a finished task.
WITH RECURSIVE
done AS (
    UPDATE tasks AS t
    SET
        status = 'COMPLETED',
        claimed_by = NULL,
        lease_until = NULL,
        error_message = NULL,
        finished_at = now(),
        updated_at = now(),
        cpu_seconds = usage.cpu,
        peak_rss_bytes = usage.rss
    FROM unnest(%(done_ids)s::text[], %(done_tokens)s::bigint[], %(done_cpu)s::float8[],
                %(done_rss)s::bigint[]) AS usage(id, token, cpu, rss)
    WHERE t.id = ANY(%(done_ids)s::text[])
      AND t.id = usage.id
      AND t.lease_token = usage.token
      AND t.status = 'RUNNING'
      AND t.claimed_by = %(worker_id)s
    RETURNING t.id, t.lease_token, t.task_type, t.slot
),
unpaused(task_type) AS MATERIALIZED (
    SELECT requested.task_type
    FROM unnest(%(task_types)s::text[]) AS requested(task_type)
    WHERE NOT EXISTS (SELECT 1 FROM task_type_pauses AS paused
                      WHERE paused.task_type = requested.task_type)
),
free_slots AS MATERIALIZED (
    SELECT free.task_type, free.slot
    FROM task_type_limits AS l
    CROSS JOIN LATERAL (
        SELECT s.task_type, s.slot FROM task_type_slots AS s
        WHERE s.task_type = l.task_type
          AND s.slot <= l.max_running
          AND (s.task_id IS NULL OR s.lease_until <= now()
               OR s.lease_token = ANY(ARRAY(SELECT done.lease_token FROM done)))
        ORDER BY s.slot
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED) AS free
    WHERE l.task_type = ANY(ARRAY(SELECT task_type FROM unpaused))
),
wanted(task_type, cap) AS MATERIALIZED (
    SELECT capped.task_type, capped.cap
    FROM (SELECT unpaused.task_type,
                 CASE WHEN NOT EXISTS (SELECT 1 FROM task_type_limits AS l
                                       WHERE l.task_type = unpaused.task_type)
                      THEN %(limit)s::bigint
                      ELSE (SELECT count(*) FROM free_slots AS f
                            WHERE f.task_type = unpaused.task_type) END AS cap
          FROM unpaused) AS capped
    WHERE capped.cap > 0
),
levels(priority) AS (
    SELECT max(top.priority)
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT t.priority FROM tasks AS t
        WHERE t.status = 'PENDING' AND t.staged AND t.task_type = wanted.task_type
        ORDER BY t.priority DESC
        LIMIT 1) AS top
  UNION ALL
    SELECT (SELECT max(top.priority)
            FROM wanted
            CROSS JOIN LATERAL (
                SELECT t.priority FROM tasks AS t
                WHERE t.status = 'PENDING' AND t.staged AND t.task_type = wanted.task_type
                  AND t.priority < levels.priority
                ORDER BY t.priority DESC
                LIMIT 1) AS top)
    FROM levels
    WHERE levels.priority IS NOT NULL
),
pending AS (
    SELECT due.id, due.task_type, levels.priority, due.scheduled_time, due.created_at
    FROM levels
    CROSS JOIN LATERAL (
        SELECT level_rows.id, wanted.task_type, level_rows.scheduled_time, level_rows.created_at
        FROM wanted
        CROSS JOIN LATERAL (
            SELECT t.id, t.scheduled_time, t.created_at FROM tasks AS t
            WHERE t.status = 'PENDING' AND t.staged AND t.task_type = wanted.task_type
              -- A range, not "=", and the index's order in full: with an equality the
              -- order is time alone, which the due-time index gives too, and the generic
              -- plan could read the level there, every older due row of any level first.
              AND t.priority >= levels.priority AND t.priority <= levels.priority
            ORDER BY t.priority DESC, t.scheduled_time, t.created_at
            LIMIT least(%(limit)s, wanted.cap)
            FOR UPDATE SKIP LOCKED) AS level_rows
        ORDER BY level_rows.scheduled_time, level_rows.created_at
        LIMIT %(limit)s) AS due
    -- A staged row may be up to the staging lead early. Checked here, after each level's
    -- rows were read in time order (its due ones first), not in the index probe: a due time
    -- there lets the generic plan read every due row through the due index instead.
    WHERE levels.priority IS NOT NULL AND due.scheduled_time <= now()
    LIMIT %(limit)s
),
expired AS (
    SELECT t.id, t.task_type, t.priority, t.scheduled_time, t.created_at FROM tasks AS t
    WHERE t.status = 'RUNNING'
      AND t.lease_until <= now()
      AND t.task_type = ANY(ARRAY(SELECT task_type FROM wanted))
      AND t.retry_count < t.max_retries
      AND NOT t.id = ANY(%(done_ids)s::text[])
    ORDER BY t.lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
ranked AS (
    SELECT both_paths.*,
           row_number() OVER (PARTITION BY both_paths.task_type
                              ORDER BY both_paths.priority DESC, both_paths.scheduled_time,
                                       both_paths.created_at) AS n
    FROM (SELECT * FROM pending UNION ALL SELECT * FROM expired) AS both_paths
),
chosen AS (
    SELECT ranked.id, ranked.task_type, ranked.n
    FROM ranked
    JOIN wanted ON wanted.task_type = ranked.task_type
    WHERE ranked.n <= wanted.cap
    ORDER BY ranked.priority DESC, ranked.scheduled_time, ranked.created_at
    LIMIT %(limit)s
),
placed AS (
    SELECT chosen.id, numbered.task_type, numbered.slot
    FROM chosen
    JOIN (SELECT f.task_type, f.slot,
                 row_number() OVER (PARTITION BY f.task_type ORDER BY f.slot) AS n
          FROM free_slots AS f) AS numbered
      ON numbered.task_type = chosen.task_type AND numbered.n = chosen.n
),
claimed AS (
    UPDATE tasks AS t
    SET
        status = 'RUNNING',
        claimed_by = %(worker_id)s,
        lease_until = now() + (%(lease_seconds)s * interval '1 second'),
        lease_token = nextval('pgtaskd_lease_token_seq'),
        -- Cannot overflow: expired takes only rows with retry_count < max_retries.
        retry_count = CASE WHEN t.status = 'RUNNING' THEN t.retry_count + 1 ELSE t.retry_count END,
        error_message = CASE WHEN t.status = 'RUNNING'
                             THEN 'lease of worker ' || coalesce(t.claimed_by, '?') || ' expired'
                             ELSE t.error_message END,
        -- Saturates: a count any client may have set to the INTEGER maximum must not
        -- abort the claim of every other task with it.
        attempts = CASE WHEN t.attempts < 2147483647 THEN t.attempts + 1
                        ELSE t.attempts END,
        started_at = now(),
        updated_at = now(),
        slot = (SELECT placed.slot FROM placed WHERE placed.id = t.id)
    WHERE t.id = ANY(ARRAY(SELECT id FROM chosen))
    RETURNING t.*
),
taken AS (
    UPDATE task_type_slots AS s
    SET task_id = c.id, lease_token = c.lease_token, lease_until = c.lease_until
    FROM claimed AS c
    WHERE c.slot IS NOT NULL AND s.task_type = c.task_type AND s.slot = c.slot
),
given_back AS (
    UPDATE task_type_slots AS s
    SET task_id = NULL, lease_token = NULL, lease_until = NULL
    FROM done
    WHERE s.task_type = done.task_type AND s.slot = done.slot
      AND s.lease_token = done.lease_token
      AND NOT EXISTS (SELECT 1 FROM placed
                      WHERE placed.task_type = s.task_type AND placed.slot = s.slot)
    RETURNING s.lease_token
)
SELECT TRUE AS completed, NULL::text AS id, NULL::text AS name, NULL::text AS task_type,
       NULL::text AS payload, NULL::integer AS priority, NULL::integer AS retry_count,
       NULL::integer AS max_retries, NULL::integer AS attempts, done.lease_token,
       NULL::timestamptz AS scheduled_time, NULL::timestamptz AS created_at,
       NULL::bigint AS position, NULL::text AS signal
FROM done
UNION ALL
SELECT FALSE, c.id, c.name, c.task_type, c.payload::text, c.priority, c.retry_count,
       c.max_retries, c.attempts, c.lease_token,
       CASE WHEN isfinite(c.scheduled_time) THEN c.scheduled_time END,
       CASE WHEN isfinite(c.created_at) THEN c.created_at END,
       row_number() OVER (ORDER BY c.priority DESC, c.scheduled_time, c.created_at), NULL
FROM claimed AS c
UNION ALL
-- One row more when a limit binds one of the worker's unpaused types: store.py then uses
-- complete_and_claim_limited from the next claim on (and this one's leftover places).
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'limited'
WHERE EXISTS (SELECT 1 FROM unpaused JOIN task_type_limits AS l USING (task_type))
UNION ALL
-- One row more for each completed claim whose task row names a slot that given_back did not
-- free nor a claim took over: the slot's row changed after this statement's snapshot (a
-- limit's setter gave the running task that slot, adopt_running_tasks, and this statement
-- waited for that task's row), so it cannot see it. store.py gives it back right after
-- (end_lost_claims).
SELECT NULL, done.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, done.lease_token, NULL, NULL,
       NULL, 'kept'
FROM done
WHERE done.slot IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM given_back WHERE given_back.lease_token = done.lease_token)
  AND NOT EXISTS (SELECT 1 FROM placed
                  WHERE placed.task_type = done.task_type AND placed.slot = done.slot);

-- name: stage_tasks
-- Stage the PENDING rows whose time is at most the staging lead away (migration 0010), at
-- most 500 at a time, through the index of the rows not staged yet: one probe when none is
-- near. Apart from the claim, so that a claim pays for none of its plan: the worker runs it
-- when its claim came up short (a task whose time came may wait unstaged) and every
-- quarter second while it claims full batches (so that a task is staged before its time on
-- a busy queue, and taken in the seed's order). Rows locked by another stager are skipped.
-- due_for_types: how many of the rows staged are due now and of the given types.
WITH to_stage AS (
    SELECT t.id FROM tasks AS t
    WHERE t.status = 'PENDING' AND NOT t.staged
      AND t.scheduled_time <= now() + pgtaskd_staging_lead()
    ORDER BY t.scheduled_time
    LIMIT 500
    FOR UPDATE SKIP LOCKED
),
staged_now AS (
    UPDATE tasks AS t SET staged = true
    FROM to_stage
    WHERE t.id = to_stage.id
    RETURNING t.task_type, t.scheduled_time <= now() AS due
)
SELECT count(*) AS staged,
       count(*) FILTER (WHERE due AND task_type = ANY(%(task_types)s::text[])) AS due_for_types
FROM staged_now;

-- name: renew_leases
-- One statement renews every lease a daemon's children hold. Each row is conditioned on its
-- owner and its fencing token; a claim missing from the answer is lost. Rows are found by
-- primary key, each matched to its own token and owner by its place in the arrays.
-- A claim that took a slot of a limited type (migration 0007) keeps its lease only with its
-- slot: a lease that lapsed and is renewed late, after another claim took the slot, is lost,
-- so that the limit holds even then. The slot's row is locked and rechecked by this UPDATE,
-- so a slot taken since this statement began is seen taken.
-- owned: the claims whose tasks are still RUNNING under them, their rows locked first (and
--   rechecked, so a claim that a cancel or a final write ended meanwhile is left out), as
--   every final write locks a task's row before its slot's: a renewal never holds a slot row
--   that a final write waits for while it waits for that write's task row. Only the owned
--   claims' slots are renewed: a claim that ended renews no slot. (A claim cancelled while
--   its handler runs keeps its slot until that run is over, cancel_task, but only for the
--   lease it had: if its owner never says the run ended, the slot is free a lease later.)
WITH owned AS MATERIALIZED (
    SELECT t.id, t.task_type, t.slot, t.lease_token FROM tasks AS t
    WHERE t.id = ANY(%(ids)s::text[])
      AND t.status = 'RUNNING'
      AND EXISTS (SELECT 1 FROM unnest(%(ids)s::text[], %(tokens)s::bigint[],
                                       %(workers)s::text[]) AS c(id, token, worker)
                  WHERE c.id = t.id AND c.token = t.lease_token AND c.worker = t.claimed_by)
    FOR UPDATE OF t
),
slots_renewed AS (
    UPDATE task_type_slots AS s
    SET lease_until = now() + (%(lease_seconds)s * interval '1 second')
    FROM owned
    WHERE s.task_type = owned.task_type AND s.slot = owned.slot
      AND s.lease_token = owned.lease_token
      -- Evaluated whole before the first slot row is locked: every owned row is locked then.
      AND s.lease_token = ANY(ARRAY(SELECT o.lease_token FROM owned AS o
                                    WHERE o.slot IS NOT NULL))
    RETURNING s.lease_token
)
UPDATE tasks AS t
SET
    lease_until = now() + (%(lease_seconds)s * interval '1 second'),
    updated_at = now()
FROM owned
WHERE t.id = owned.id
  AND (owned.slot IS NULL OR owned.lease_token IN (SELECT lease_token FROM slots_renewed))
RETURNING t.lease_token;

-- name: claim_states
-- Why claims were lost: what their tasks are now.
SELECT id, status, lease_token FROM tasks WHERE id = ANY(%(ids)s::text[]);

-- name: unheard_claims
-- Claims a dead child made that its supervisor never heard of: it died between its claim's
-- commit and its message. Only claims made before it died (started_at is the claim's now()):
-- once its pid is free, another daemon on this host may fork a child with the same worker
-- id, and its claims are not ours to settle. The lease index serves status = 'RUNNING'.
SELECT t.id, t.lease_token, t.task_type
FROM tasks AS t
WHERE t.status = 'RUNNING'
  AND t.claimed_by = %(worker_id)s
  AND t.started_at <= now() - (%(died_seconds_ago)s * interval '1 second')
  AND t.lease_token IS NOT NULL
  AND NOT t.lease_token = ANY(%(known_tokens)s::bigint[])
LIMIT %(limit)s;

-- name: statements_still_running
-- A dead child's backends that may still commit for it: a backend finds its client gone only
-- when it next reads or answers, and runs first a statement already in its socket (seen idle
-- here a moment before it read it), so a direct connection counts until its backend exits.
-- Through a transaction pooler (%(pooled)s) the server's backends outlive their clients and
-- keep the last one's name while idle, so only a statement under way counts; a state hidden
-- from this role reads as NULL and counts as none.
SELECT count(*) AS running
FROM pg_stat_activity
WHERE datname = current_database()
  AND application_name = %(name)s
  AND (NOT %(pooled)s OR state <> 'idle');

-- name: release_tasks
-- Give claims back without spending a retry: a stopping daemon, or tasks of a batch that
-- would wait too long behind a slow handler. Conditioned on each claim's token. Their slots
-- (limited types) are given back: none of them runs.
WITH released AS (
    UPDATE tasks AS t
    SET
        status = 'PENDING',
        claimed_by = NULL,
        lease_token = NULL,
        lease_until = NULL,
        updated_at = now()
    FROM unnest(%(ids)s::text[], %(tokens)s::bigint[]) AS asked(id, token)
    WHERE t.id = ANY(%(ids)s::text[])
      AND t.id = asked.id
      AND t.lease_token = asked.token
      AND t.status = 'RUNNING'
    RETURNING t.id, t.task_type, t.slot, asked.token AS ended_token
),
given_back AS (
    UPDATE task_type_slots AS s
    SET task_id = NULL, lease_token = NULL, lease_until = NULL
    FROM released AS ended
    WHERE s.task_type = ended.task_type AND s.slot = ended.slot
      AND s.lease_token = ended.ended_token
    RETURNING s.lease_token
)
-- slot_kept: its row names a slot given_back did not free, one a limit's setter gave the
-- task after this statement's snapshot (complete_and_claim's 'kept' rows): store.py gives it
-- back right after.
SELECT released.id,
       released.slot IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM given_back
                       WHERE given_back.lease_token = released.ended_token) AS slot_kept
FROM released;

-- name: fail_attempt
-- A failed run: back to PENDING after the backoff, or FAILED once max_retries retries were
-- spent (max_retries 3 means 4 runs in all) or at once when the failure is permanent. The run
-- is over: its slot (a limited type) is given back. (A claim lost meanwhile changes no row
-- here: a slot a cancel left it goes back through end_lost_claims, else with its lease.) The
-- run is recorded in the task's failed attempts (migration 0012), with what the worker says
-- of it: %(outcome)s, the exception's type, message and traceback.
WITH failed AS (
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
        cpu_seconds = %(cpu_seconds)s::float8,
        peak_rss_bytes = %(peak_rss_bytes)s::bigint,
        claimed_by = NULL,
        lease_until = NULL,
        updated_at = now()
    WHERE t.id = %(task_id)s
      AND t.status = 'RUNNING'
      AND t.claimed_by = %(worker_id)s
      AND t.lease_token = %(token)s
    RETURNING t.status, t.retry_count,
              CASE WHEN t.status = 'PENDING'
                   THEN greatest(extract(epoch FROM t.scheduled_time - now()), 0)::float8
              END AS retry_delay,
              t.task_type, t.slot, t.attempts, t.started_at
),
given_back AS (
    UPDATE task_type_slots AS s
    SET task_id = NULL, lease_token = NULL, lease_until = NULL
    FROM failed AS ended
    WHERE s.task_type = ended.task_type AND s.slot = ended.slot
      AND s.lease_token = %(token)s

    RETURNING s.lease_token
),
recorded AS (
    INSERT INTO task_attempts (task_id, attempt, worker_id, started_at, outcome, error_type,
                               message, traceback)
    SELECT %(task_id)s, failed.attempts, %(worker_id)s, failed.started_at, %(outcome)s,
           %(error_type)s, %(message)s, %(traceback)s
    FROM failed
)
-- slot_kept: as release_tasks says.
SELECT status, retry_count, retry_delay,
       slot IS NOT NULL AND NOT EXISTS (SELECT 1 FROM given_back) AS slot_kept
FROM failed;

-- name: rescue_task
-- The supervisor saw the child holding this claim die: the run counts as a failed attempt at
-- once, instead of after the lease expires. Conditioned on the claim's token only, because
-- the dead child's worker id is the one on the row. A dead child runs nothing: its slot (a
-- limited type) is given back. The run is recorded in the task's failed attempts: how the
-- child ended (%(outcome)s, and the %(signal)s that killed it, if one did).
WITH rescued AS (
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
              CASE WHEN t.status = 'PENDING'
                   THEN greatest(extract(epoch FROM t.scheduled_time - now()), 0)::float8
              END AS retry_delay,
              t.slot, t.attempts, t.started_at
),
given_back AS (
    UPDATE task_type_slots AS s
    SET task_id = NULL, lease_token = NULL, lease_until = NULL
    FROM rescued AS ended
    WHERE s.task_type = ended.task_type AND s.slot = ended.slot
      AND s.lease_token = %(token)s

    RETURNING s.lease_token
),
recorded AS (
    INSERT INTO task_attempts (task_id, attempt, worker_id, started_at, outcome, message,
                               signal)
    SELECT rescued.id, rescued.attempts, %(worker_id)s, rescued.started_at, %(outcome)s,
           %(error)s, %(signal)s
    FROM rescued
)
-- slot_kept: as release_tasks says.
SELECT id, task_type, status, retry_count, retry_delay,
       slot IS NOT NULL AND NOT EXISTS (SELECT 1 FROM given_back) AS slot_kept
FROM rescued;

-- name: reap_expired_leases
-- Tasks whose owner stopped renewing (a worker of any daemon that died or was cut off). Safe
-- for many daemons at once: SKIP LOCKED splits the batch and the UPDATE re-checks the lease.
-- The slots (limited types) of the reaped claims are given back: their leases ran out with
-- the tasks', so they are free already, but a slot row should not name a claim that ended.
-- A RUNNING row with no lease at all (written by plain SQL: no claim leaves one) has no owner
-- that renews it and no claim takes it over, so it counts as expired here. Each kind is one
-- range of tasks_lease_idx (NULLs first: they are rare and would otherwise wait forever).
-- Each reaped run is recorded in its task's failed attempts, as a lost lease.
WITH expired AS (
    SELECT unleased.id, unleased.slot, unleased.lease_token, unleased.claimed_by FROM (
        SELECT id, slot, lease_token, claimed_by FROM tasks
        WHERE status = 'RUNNING' AND lease_until IS NULL
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED) AS unleased
    UNION ALL
    SELECT ran_out.id, ran_out.slot, ran_out.lease_token, ran_out.claimed_by FROM (
        SELECT id, slot, lease_token, claimed_by FROM tasks
        WHERE status = 'RUNNING' AND lease_until <= now()
        ORDER BY lease_until
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED) AS ran_out
    LIMIT %(batch_size)s
),
reaped AS (
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
        error_message = CASE WHEN t.lease_until IS NULL
                             THEN 'RUNNING under worker ' || coalesce(t.claimed_by, '?')
                                  || ' with no lease (set by hand?): nobody renews it'
                             ELSE 'lease of worker ' || coalesce(t.claimed_by, '?')
                                  || ' expired: the worker stopped renewing it' END,
        claimed_by = NULL,
        lease_token = NULL,
        lease_until = NULL,
        updated_at = now()
    FROM expired
    WHERE t.id = expired.id
      AND t.status = 'RUNNING'
      AND (t.lease_until IS NULL OR t.lease_until <= now())
    RETURNING t.id, t.task_type, t.status, t.retry_count, t.error_message,
              CASE WHEN t.status = 'PENDING'
                   THEN greatest(extract(epoch FROM t.scheduled_time - now()), 0)::float8
              END AS retry_delay,
              expired.slot, expired.lease_token AS ended_token, expired.claimed_by,
              t.attempts, t.started_at
),
given_back AS (
    UPDATE task_type_slots AS s
    SET task_id = NULL, lease_token = NULL, lease_until = NULL
    FROM reaped
    WHERE s.task_type = reaped.task_type AND s.slot = reaped.slot
      AND s.lease_token = reaped.ended_token
),
recorded AS (
    INSERT INTO task_attempts (task_id, attempt, worker_id, started_at, outcome, message)
    SELECT reaped.id, reaped.attempts, reaped.claimed_by, reaped.started_at, 'lease_lost',
           reaped.error_message
    FROM reaped
)
SELECT id, task_type, status, retry_count, error_message, retry_delay FROM reaped;

-- name: delete_finished_tasks
-- Retention: one batch of %(status)s tasks that finished more than %(older_than_seconds)s
-- seconds ago (by the database's clock), deleted in one short statement. A row marked
-- finished by hand without a finished_at is aged by its updated_at instead.
-- Each branch is one range of tasks_finished_idx (status, finished_at): finished_at below
-- the cutoff, oldest first, then finished_at IS NULL. The literal status list repeats the
-- index's predicate, so that a generic plan (psycopg prepares a statement run five times),
-- which cannot see the value of %(status)s, can still prove the partial index applies;
-- without it that plan reads the whole table.
-- SKIP LOCKED, not a plain FOR UPDATE: every daemon on the database runs retention, and
-- with SKIP LOCKED concurrent passes take disjoint batches and none ever waits on another,
-- nor on an operator's session holding a finished row (a retry in progress): a skipped row
-- is simply left for a later pass. A plain lock would queue each daemon behind the others'
-- batches (and behind any open transaction), only to find the rows gone.
-- Rows are deleted by primary key; the status is checked again as they are.
WITH doomed AS (
    SELECT aged.id FROM (
        SELECT id FROM tasks
        WHERE status = %(status)s
          AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')
          AND finished_at < now() - (%(older_than_seconds)s * interval '1 second')
        ORDER BY finished_at
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED) AS aged
    UNION ALL
    SELECT undated.id FROM (
        SELECT id FROM tasks
        WHERE status = %(status)s
          AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')
          AND finished_at IS NULL
          AND updated_at < now() - (%(older_than_seconds)s * interval '1 second')
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED) AS undated
    LIMIT %(batch_size)s
)
DELETE FROM tasks AS t
WHERE t.id = ANY(ARRAY(SELECT id FROM doomed))
  AND t.status = %(status)s;

-- name: cancel_task
-- A cancel ends the claim of a RUNNING task, but not its run: the handler runs on until it
-- sees the cancel at a safe point (or its child is killed), so the claim's slot (a limited
-- type) stays held under the claim's token until that run is over: given back by the owner
-- when its handler stopped (end_lost_claims), by the supervisor once the child is dead, or
-- when the slot's lease runs out (no renewal extends it: the task is no longer RUNNING).
-- Freed here, the next task of the type started while this one still ran. The task row
-- keeps naming its slot, which is how end_lost_claims finds it.
-- The error of an earlier attempt is cleared: a cancelled task did not end by it (the task's
-- failed attempts keep it).
UPDATE tasks AS t
SET
    status = 'CANCELLED',
    error_message = NULL,
    claimed_by = NULL,
    lease_token = NULL,
    lease_until = NULL,
    finished_at = now(),
    updated_at = now()
WHERE t.id = %(task_id)s
  AND t.status IN ('PENDING', 'RUNNING')
RETURNING t.id, t.status;

-- name: end_lost_claims
-- The runs of claims their owner lost are over: their handlers stopped, or the child that
-- ran them is dead. A claim cancelled while RUNNING kept its slot for its run (cancel_task);
-- that slot is given back now, if it is still held under the claim's token. A claim still
-- RUNNING under its token is not lost, and keeps its slot for its owner's final write; a
-- slot another claim took since holds another token and is left alone.
-- target: the tasks, their rows locked first (in id order, as a renewal's index scan locks
--   its rows), as every final write locks a task's row before its slot's, so that no two
--   statements wait for each other in a cycle.
-- The slot is looked for among its type's (the primary key's first column), not by the
-- task row's slot alone: an operator's retry of a cancelled task may have claimed it again
-- in another slot while the cancelled run was still stopping.
-- Returns each task's status and token as they are now (task_status), so that the owner
-- learns what ended the claim from the same round trip.
WITH target AS MATERIALIZED (
    SELECT t.id, t.task_type, t.status, t.lease_token FROM tasks AS t
    WHERE t.id = ANY(%(ids)s::text[])
    ORDER BY t.id
    FOR UPDATE
),
ended AS MATERIALIZED (
    SELECT target.id, target.task_type, asked.token
    FROM unnest(%(ids)s::text[], %(tokens)s::bigint[]) AS asked(id, token)
    JOIN target ON target.id = asked.id
    WHERE target.status <> 'RUNNING' OR target.lease_token IS DISTINCT FROM asked.token
),
given_back AS (
    UPDATE task_type_slots AS s
    SET task_id = NULL, lease_token = NULL, lease_until = NULL
    FROM ended
    WHERE s.task_type = ended.task_type
      AND s.task_id = ended.id
      AND s.lease_token = ended.token
      -- Evaluated whole before the first slot row is locked: every target row is locked then.
      AND s.lease_token = ANY(ARRAY(SELECT e.token FROM ended AS e))
)
SELECT id, status, lease_token FROM target;

-- name: get_task
SELECT * FROM tasks WHERE id = %(task_id)s;

-- name: failed_attempts
-- A task's failed attempts (migration 0012), the newest %(limit)s of them, oldest first,
-- read through the primary key.
SELECT kept.attempt, kept.outcome, kept.worker_id, kept.started_at, kept.ended_at,
       kept.error_type, kept.message, kept.signal, kept.traceback
FROM (SELECT * FROM task_attempts
       WHERE task_id = %(task_id)s
       ORDER BY id DESC
       LIMIT %(limit)s) AS kept
ORDER BY kept.id;

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
-- One round trip for the health check, the queue gauges and `pgtaskd stats`, at a cost that
-- neither the queue's length nor the number of paused types multiplies (every daemon runs it
-- every few seconds: counting 1,220,000 PENDING tasks took 226 ms; comparing each due task
-- with each of 30,000 paused types, 21 s).
-- It reads the oldest due tasks, at most cap + 1 of them (head), and marks each paused or not
-- with a lookup in task_type_pauses (hashed, or by its key: never a scan of every pause per
-- task). With no pause at all, the common case, head reads the due index alone (a branch
-- that needs no task_type, so no table row), and looks nothing up.
-- head_full: the due tasks did not all fit, so due_pending and paused_due are lower bounds
-- (the caller says "at least"); old_pending is exact unless every task in head is old.
-- oldest_pending_age is the oldest task in head that is not paused, exact because head holds
-- the oldest due tasks; only when head is full and all paused does a second probe read on,
-- past the paused types' tasks (one lookup each), to the first that is not paused. NULL when
-- no due task of a type not paused waits. A client may schedule a task at -infinity: its
-- wait counts from year 1, so the age stays a number (JSON has no Infinity) and still far
-- past any max_pending_age. paused_types lists the paused types, in order.
-- types: the task types the asking daemon runs, or NULL for every type. A due task of a type
-- not in it is another daemon's to run: it waits for no fault of this one, so, like a paused
-- one, it counts apart (foreign_due) and never in old_pending or the age (a liveness probe
-- on /healthz restarted healthy daemons for it).
WITH any_paused AS MATERIALIZED (
    -- "yes" when rows must be looked at one by one: a pause exists, or only some types count.
    SELECT EXISTS (SELECT FROM task_type_pauses) OR %(types)s::text[] IS NOT NULL AS yes
),
marked AS MATERIALIZED (
    (SELECT t.scheduled_time, false AS paused, false AS foreign_type
       FROM tasks AS t
      WHERE t.status = 'PENDING' AND t.scheduled_time <= now()
        AND NOT (SELECT yes FROM any_paused)
      ORDER BY t.scheduled_time
      LIMIT %(cap)s + 1)
    UNION ALL
    (SELECT t.scheduled_time,
            EXISTS (SELECT FROM task_type_pauses AS p WHERE p.task_type = t.task_type),
            coalesce(NOT t.task_type = ANY(%(types)s::text[]), false)
       FROM tasks AS t
      WHERE t.status = 'PENDING' AND t.scheduled_time <= now()
        AND (SELECT yes FROM any_paused)
      ORDER BY t.scheduled_time
      LIMIT %(cap)s + 1)
),
summary AS MATERIALIZED (
    SELECT count(*) > %(cap)s AS head_full,
           count(*) > %(cap)s AND (SELECT yes FROM any_paused) AS paused_at_least,
           count(*) FILTER (WHERE NOT paused AND NOT foreign_type) AS due_pending,
           count(*) FILTER (WHERE paused) AS paused_due,
           count(*) FILTER (WHERE foreign_type AND NOT paused) AS foreign_due,
           count(*) FILTER (WHERE NOT paused AND NOT foreign_type AND scheduled_time
                                  <= now() - (%(max_pending_age)s * interval '1 second'))
               AS old_in_head,
           bool_and(scheduled_time <= now() - (%(max_pending_age)s * interval '1 second'))
               AS all_old,
           min(scheduled_time) FILTER (WHERE NOT paused AND NOT foreign_type) AS oldest_in_head
    FROM marked
),
oldest AS MATERIALIZED (
    SELECT CASE
               WHEN summary.oldest_in_head IS NOT NULL OR NOT summary.head_full
                   THEN summary.oldest_in_head
               ELSE (SELECT t.scheduled_time
                       FROM tasks AS t
                      WHERE t.status = 'PENDING' AND t.scheduled_time <= now()
                        AND NOT EXISTS (SELECT 1 FROM task_type_pauses AS p
                                         WHERE p.task_type = t.task_type)
                        AND coalesce(t.task_type = ANY(%(types)s::text[]), true)
                      ORDER BY t.scheduled_time
                      LIMIT 1)
           END AS oldest
    FROM summary
),
oldest_age AS (
    SELECT oldest.oldest,
           coalesce(oldest.oldest <= now() - (%(max_pending_age)s * interval '1 second'), false)
               AS is_old
    FROM oldest
),
leases AS (
    SELECT count(*) AS expired,
           count(*) FILTER (WHERE stuck) AS stuck
    FROM (SELECT t.lease_until <= now() - (%(lease_grace)s * interval '1 second') AS stuck
            FROM tasks AS t
           WHERE t.status = 'RUNNING' AND t.lease_until <= now()
           ORDER BY t.lease_until
           LIMIT %(cap)s + 1) AS expired
)
SELECT
    summary.due_pending,
    summary.paused_due,
    summary.foreign_due,
    -- An old task of a type not paused found past a full head of paused ones counts 1.
    CASE WHEN summary.old_in_head = 0 AND oldest.is_old THEN 1
         ELSE summary.old_in_head END AS old_pending,
    summary.head_full,
    summary.paused_at_least,
    -- More old tasks may follow head only if all of it is old, and some counted.
    summary.head_full AND coalesce(summary.all_old, false)
        AND (summary.old_in_head > 0 OR oldest.is_old) AS old_pending_at_least,
    leases.expired AS expired_leases,
    leases.stuck AS stuck_leases,
    leases.expired > %(cap)s AS leases_at_least,
    CASE WHEN oldest.oldest IS NOT NULL
         THEN extract(epoch FROM now() - greatest(oldest.oldest, '0001-01-01 00:00Z'))::float8
    END AS oldest_pending_age,
    (SELECT coalesce(array_agg(p.task_type ORDER BY p.task_type), '{}')
       FROM task_type_pauses AS p) AS paused_types
FROM summary CROSS JOIN oldest_age AS oldest CROSS JOIN leases;

-- name: queue_by_type_plan
-- Run first, in queue_by_type's transaction: a gap between two named types is a range of the
-- walk index whose size no estimate knows (the generic guess is 0.5 per cent of the table),
-- so PostgreSQL 16 read it by a bitmap scan and a sort, every row of it, however many, where
-- an ordered scan stops at the cap (20,000 rows of new types in a gap: 810 buffers;
-- 80,000: 2,503; with this, 497 and 590).
SET LOCAL enable_bitmapscan = off;

-- name: queue_by_type
-- The queue gauges by task type, for the health check (every daemon, every few seconds), at
-- a cost that neither the queue's length nor the number of types in it multiplies: a row
-- may carry any type, so only the types a daemon's configs name (%(types)s) get their own
-- figures, and every other type is folded into one (other), however many there are.
-- pending: a known type's PENDING tasks, counted through tasks_pending_walk_idx up to
--   %(cap)s + 1 (the caller says "at least" past it); in the index's order, or the plan
--   scanned the table for a type with no row.
-- other_pending: PENDING tasks of the other types, counted in the gaps of the index between
--   the known types (one range scan per gap, each up to %(cap)s + 1), so never by reading the
--   known types' rows; past %(cap)s, "at least". Ordered by type so that the plan walks the
--   index: a range's rows are rare or none, and a scan of the table to find them read all.
-- running: RUNNING tasks by type, the other types folded (NULL), from their partial index
--   (they are bounded by the workers).
-- oldest_due: when a type's oldest due PENDING task became due: each priority level's first
--   staged row by time (at most %(max_levels)s levels, highest first, as console_overview),
--   and the first due one of the rows not staged yet (a task whose time came may wait
--   unstaged until a claim stages it: few, as claims stage them; asked for due ones only, or
--   the plan read every future row of the other types), the oldest of those that are due. Paused types included: an alert
--   excludes them by pgtaskd_task_type_paused.
-- Every probe asks for its index's whole order (a level as a one-value range): PostgreSQL 16
--   otherwise read a level by the due-time index and a type's unstaged rows by the unstaged
--   index, each of which grows with the table. Run after queue_by_type_plan.
-- For the other types, the oldest is looked for in the first %(max_other)s of them by name
--   (a loose scan of tasks_pending_walk_idx, one probe per type, that steps over the known
--   ones); other_types_at_least: more types wait than that, so the other types' oldest is a
--   lower bound of their age.
WITH RECURSIVE
known(task_type) AS MATERIALIZED (
    SELECT DISTINCT k FROM unnest(%(types)s::text[]) AS k WHERE k IS NOT NULL
),
-- The ranges between consecutive known types, in the index's order; (NULL, NULL): every type.
gaps AS MATERIALIZED (
    SELECT lag(known.task_type) OVER (ORDER BY known.task_type) AS lo, known.task_type AS hi
    FROM known
    UNION ALL
    SELECT max(known.task_type), NULL FROM known
),
pending_types(task_type, n) AS (
    (SELECT t.task_type, 1 FROM tasks AS t
      WHERE t.status = 'PENDING'
      ORDER BY t.task_type LIMIT 1)
  UNION ALL
    SELECT (SELECT t.task_type FROM tasks AS t
             WHERE t.status = 'PENDING' AND t.task_type > p.task_type
             ORDER BY t.task_type LIMIT 1),
           p.n + CASE WHEN p.task_type IN (SELECT known.task_type FROM known) THEN 0 ELSE 1 END
    FROM pending_types AS p
    WHERE p.task_type IS NOT NULL AND p.n <= %(max_other)s
),
other_types AS MATERIALIZED (
    SELECT p.task_type FROM pending_types AS p
    WHERE p.task_type IS NOT NULL AND p.task_type NOT IN (SELECT known.task_type FROM known)
),
oldest AS MATERIALIZED (
    SELECT typed.task_type, typed.known, due.due_since
    FROM (SELECT known.task_type, true AS known FROM known
          UNION ALL
          SELECT o.task_type, false FROM (SELECT * FROM other_types LIMIT %(max_other)s) AS o)
         AS typed
    CROSS JOIN LATERAL (
        WITH RECURSIVE type_levels(priority, n) AS (
            (SELECT t.priority, 1 FROM tasks AS t
              WHERE t.status = 'PENDING' AND t.staged AND t.task_type = typed.task_type
              ORDER BY t.task_type, t.priority DESC LIMIT 1)
          UNION ALL
            SELECT (SELECT t.priority FROM tasks AS t
                     WHERE t.status = 'PENDING' AND t.staged AND t.task_type = typed.task_type
                       AND t.priority < type_levels.priority
                     ORDER BY t.task_type, t.priority DESC LIMIT 1), type_levels.n + 1
            FROM type_levels
            WHERE type_levels.priority IS NOT NULL AND type_levels.n < %(max_levels)s
        )
        SELECT min(firsts.scheduled_time) FILTER (WHERE firsts.scheduled_time <= now())
                   AS due_since
        FROM (SELECT first_row.scheduled_time
                FROM type_levels
                CROSS JOIN LATERAL (
                    SELECT t.scheduled_time FROM tasks AS t
                    WHERE t.status = 'PENDING' AND t.staged AND t.task_type = typed.task_type
                      AND t.priority >= type_levels.priority
                      AND t.priority <= type_levels.priority
                    ORDER BY t.task_type, t.priority DESC, t.scheduled_time, t.created_at
                    LIMIT 1) AS first_row
               WHERE type_levels.priority IS NOT NULL
              UNION ALL
              (SELECT t.scheduled_time FROM tasks AS t
                WHERE t.status = 'PENDING' AND NOT t.staged AND t.task_type = typed.task_type
                  AND t.scheduled_time <= now()
                ORDER BY t.task_type, t.scheduled_time LIMIT 1)) AS firsts
    ) AS due
),
running AS MATERIALIZED (
    SELECT t.task_type, count(*) AS running FROM tasks AS t
    WHERE t.status = 'RUNNING'
    GROUP BY t.task_type
)
SELECT known.task_type,
       (SELECT count(*) FROM (SELECT 1 FROM tasks AS t
                               WHERE t.status = 'PENDING' AND t.task_type = known.task_type
                               ORDER BY t.created_at
                               LIMIT %(cap)s + 1) AS capped) AS pending,
       coalesce((SELECT r.running FROM running AS r WHERE r.task_type = known.task_type), 0)
           AS running,
       -- greatest() passes over a NULL: only a due time is made an age.
       (SELECT extract(epoch FROM now() - greatest(o.due_since, '0001-01-01 00:00Z'))::float8
          FROM oldest AS o WHERE o.known AND o.task_type = known.task_type
           AND o.due_since IS NOT NULL) AS oldest_due_age,
       false AS other_types_at_least
FROM known
UNION ALL
SELECT NULL,
       (SELECT count(*) FROM (
            SELECT 1 FROM gaps
            CROSS JOIN LATERAL (
                (SELECT 1 FROM tasks AS t
                  WHERE gaps.lo IS NOT NULL AND gaps.hi IS NOT NULL AND t.status = 'PENDING'
                    AND t.task_type > gaps.lo AND t.task_type < gaps.hi
                  ORDER BY t.task_type, t.created_at, t.id
                  LIMIT %(cap)s + 1)
                UNION ALL
                (SELECT 1 FROM tasks AS t
                  WHERE gaps.lo IS NULL AND gaps.hi IS NOT NULL AND t.status = 'PENDING'
                    AND t.task_type < gaps.hi
                  ORDER BY t.task_type, t.created_at, t.id
                  LIMIT %(cap)s + 1)
                UNION ALL
                (SELECT 1 FROM tasks AS t
                  WHERE gaps.lo IS NOT NULL AND gaps.hi IS NULL AND t.status = 'PENDING'
                    AND t.task_type > gaps.lo
                  ORDER BY t.task_type, t.created_at, t.id
                  LIMIT %(cap)s + 1)
                UNION ALL
                (SELECT 1 FROM tasks AS t
                  WHERE gaps.lo IS NULL AND gaps.hi IS NULL AND t.status = 'PENDING'
                  LIMIT %(cap)s + 1)) AS in_gap
            LIMIT %(cap)s + 1) AS capped),
       (SELECT coalesce(sum(r.running), 0)::bigint FROM running AS r
         WHERE r.task_type NOT IN (SELECT known.task_type FROM known)),
       (SELECT extract(epoch FROM now() - greatest(min(o.due_since), '0001-01-01 00:00Z'))::float8
          FROM oldest AS o WHERE NOT o.known HAVING min(o.due_since) IS NOT NULL),
       (SELECT count(*) FROM other_types) > %(max_other)s;

-- name: sample_pending_by_type
-- The health check's per-type PENDING figures past the count cap: about %(percent)s per cent
-- of the table's pages, picked at random (a fixed number of rows, whatever the table holds),
-- PENDING rows by type, the types not in %(types)s folded into one (NULL); the caller splits
-- the estimated PENDING total by these shares.
SELECT CASE WHEN t.task_type = ANY(%(types)s::text[]) THEN t.task_type END AS task_type,
       count(*) AS count
FROM tasks AS t TABLESAMPLE SYSTEM (%(percent)s)
WHERE t.status = 'PENDING'
GROUP BY 1;

-- name: count_by_status
-- Exact, and it reads every row: for tools and tests. The daemon's health check uses
-- live_counts instead.
SELECT status, count(*) AS count FROM tasks GROUP BY status;

-- name: live_counts
-- What the health check reads every few seconds on every daemon, whatever the table holds.
-- RUNNING tasks are counted exactly from their partial index (they are bounded by the
-- workers). PENDING ones are counted up to cap + 1 (pending_seen): past that, and for the
-- finished rows, which may be millions (counting 5,000,000 took 355-474 ms), the caller
-- estimates from the planner's statistics: each status's share from the last ANALYZE, times
-- the table's rows, which the planner's own way scales from the last count of pages to the
-- pages there are now (NULL: never counted).
SELECT (SELECT count(*) FROM (SELECT 1 FROM tasks WHERE status = 'PENDING'
                               LIMIT %(cap)s + 1) AS pending) AS pending_seen,
       (SELECT count(*) FROM tasks WHERE status = 'RUNNING') AS running,
       (SELECT CASE WHEN c.reltuples < 0 THEN NULL
                    WHEN c.relpages = 0 THEN c.reltuples::float8
                    ELSE (c.reltuples / c.relpages
                          * (pg_relation_size(c.oid) / current_setting('block_size')::int))::float8
               END
          FROM pg_class AS c WHERE c.oid = 'tasks'::regclass) AS table_rows,
       (SELECT json_object_agg(shares.status, shares.share)
          FROM pg_stats AS s
          CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs)
               AS shares(status, share)
         WHERE s.tablename = 'tasks' AND s.attname = 'status'
           AND s.schemaname = (SELECT n.nspname FROM pg_class AS c
                                 JOIN pg_namespace AS n ON n.oid = c.relnamespace
                                WHERE c.oid = 'tasks'::regclass)) AS shares;

-- name: count_finished
-- Finished rows by status, exactly (through tasks_finished_idx), for small tables.
SELECT status, count(*) AS count
FROM tasks
WHERE status IN ('COMPLETED', 'FAILED', 'CANCELLED')
GROUP BY status;

-- name: sample_by_type_and_status
-- `pgtaskd stats` on a large table: a GROUP BY of every row took 1.44 s on 6,270,000. Reads
-- about percent per cent of the table's pages, picked at random; the caller scales each status's
-- counts by type to that status's total.
SELECT task_type, status, count(*) AS count
FROM tasks TABLESAMPLE SYSTEM (%(percent)s)
GROUP BY task_type, status;

-- name: live_by_type
-- RUNNING tasks by type, from their partial index; PENDING ones too when the caller knows
-- they are few (pending: at most the count cap).
SELECT task_type, 'RUNNING' AS status, count(*) AS count
FROM tasks WHERE status = 'RUNNING' GROUP BY task_type
UNION ALL
SELECT task_type, 'PENDING' AS status, count(*) AS count
FROM tasks WHERE status = 'PENDING' AND %(pending)s::boolean GROUP BY task_type;

-- name: submit_tasks
-- The client's submit, for one task or thousands in one statement: one JSON array of task
-- objects, one row per element (a single text parameter: binding eight arrays of ten
-- thousand elements cost the client more than the insert).
-- ON CONFLICT DO NOTHING names no conflict target, so that every unique index is an arbiter:
-- the primary key (an id that exists already, or a second copy of an id in the same batch)
-- and tasks_live_unique_key_idx (a unique key a PENDING or RUNNING task holds, or a second
-- use of a key in the same batch). Naming one would make a conflict on the other an error,
-- which would abort a caller's transaction. In both cases the first copy wins and the row
-- inserts nothing, so RETURNING lists only the tasks this statement created (with their
-- keys: the same id given twice with different keys tells which copy landed). A concurrent
-- submit of the same id or live key waits for the other transaction and then inserts
-- nothing. A delay counts from the database's clock, never the client's.
INSERT INTO tasks (id, name, task_type, payload, priority, scheduled_time, max_retries,
                   unique_key)
SELECT batch.id, batch.name, batch.task_type, batch.payload, batch.priority,
       coalesce(batch.run_at, now() + coalesce(batch.delay_seconds, 0) * interval '1 second'),
       batch.max_retries, batch.unique_key
FROM ROWS FROM (jsonb_to_recordset(%(tasks)s::jsonb)
                AS (id text, name text, task_type text, payload jsonb, priority integer,
                    run_at timestamptz, delay_seconds double precision, max_retries integer,
                    unique_key text))
     WITH ORDINALITY AS batch(id, name, task_type, payload, priority, run_at, delay_seconds,
                              max_retries, unique_key, position)
ORDER BY batch.position
ON CONFLICT DO NOTHING
RETURNING id, unique_key;

-- name: find_submitted
-- Why submitted tasks with a unique key were not created: which of their ids exist (in any
-- status), and which live task holds each of their keys. A statement of its own, run after
-- submit_tasks: a holder that a concurrent submit committed while our insert waited for it
-- is newer than that insert's snapshot, but not than this one's (READ COMMITTED).
SELECT t.id, NULL::text AS unique_key
FROM tasks AS t
WHERE t.id = ANY(%(ids)s::text[])
UNION ALL
SELECT t.id, t.unique_key
FROM tasks AS t
WHERE t.unique_key = ANY(%(keys)s::text[])
  AND t.status IN ('PENDING', 'RUNNING')
  AND t.unique_key IS NOT NULL;

-- name: retry_task
-- An operator's retry: a FAILED or CANCELLED task runs again from scratch, with its whole
-- retry budget and no trace of the last failure. attempts keeps counting every run ever made.
-- A task whose unique key another PENDING or RUNNING task holds now is left as it is: the
-- unique index would refuse it, and the caller names the holder (unique_key_holder). A holder
-- committed after this statement's snapshot still makes the index refuse the row, which the
-- caller catches.
UPDATE tasks AS t
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
WHERE t.id = %(task_id)s
  AND t.status IN ('FAILED', 'CANCELLED')
  AND NOT EXISTS (SELECT 1 FROM tasks AS holder
                  WHERE holder.unique_key = t.unique_key
                    AND holder.status IN ('PENDING', 'RUNNING'))
RETURNING t.id, t.status;

-- name: unique_key_holder
-- The PENDING or RUNNING task, other than this one, that holds this task's unique key.
SELECT holder.id, holder.status, holder.unique_key
FROM tasks AS t
JOIN tasks AS holder ON holder.unique_key = t.unique_key
WHERE t.id = %(task_id)s
  AND holder.id <> t.id
  AND holder.status IN ('PENDING', 'RUNNING')
  AND holder.unique_key IS NOT NULL;

-- name: bulk_window
-- The time window of a bulk action (retry, cancel, purge by filter), fixed once as it starts
-- and by the database's clock: a duration counts back from now(). Its end is never later than
-- the start, so that a task finished or submitted while the action runs is not taken: a task
-- the action retried, that failed again meanwhile, is not met again further on, and a producer
-- still submitting cannot keep a cancel going. As text, so that a bound no Python datetime
-- holds ('infinity', the year 20000) passes through the client to the batches unchanged.
SELECT coalesce(%(since_at)s::timestamptz,
                now() - %(since_seconds)s::float8 * interval '1 second',
                '-infinity')::text AS since,
       least(coalesce(%(before_at)s::timestamptz,
                      now() - %(before_seconds)s::float8 * interval '1 second'),
             now())::text AS before;

-- name: next_finished_type
-- The first task type after %(after)s (NULL: the first of all) that has tasks of this finished
-- status. A bulk action given no type walks the types one by one, so that each walk is one
-- range of tasks_finished_walk_idx, its time window included; each probe is one index lookup.
-- The literal status list repeats the index's predicate, so that a generic plan can use it.
SELECT CASE WHEN %(after)s::text IS NULL
            THEN (SELECT min(t.task_type) FROM tasks AS t
                  WHERE t.status = %(status)s
                    AND t.status IN ('COMPLETED', 'FAILED', 'CANCELLED'))
            ELSE (SELECT min(t.task_type) FROM tasks AS t
                  WHERE t.status = %(status)s
                    AND t.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
                    AND t.task_type > %(after)s::text)
       END AS task_type;

-- name: next_pending_type
-- next_finished_type for PENDING tasks, through tasks_pending_walk_idx.
SELECT CASE WHEN %(after)s::text IS NULL
            THEN (SELECT min(t.task_type) FROM tasks AS t WHERE t.status = 'PENDING')
            ELSE (SELECT min(t.task_type) FROM tasks AS t
                  WHERE t.status = 'PENDING' AND t.task_type > %(after)s::text)
       END AS task_type;

-- name: scan_finished_tasks
-- One batch of a bulk retry or purge, read without a lock: at most %(limit)s tasks of one
-- finished status and type, in the window, after the batch before's last row (a keyset on
-- tasks_finished_walk_idx, so every batch is one short index range), with whether each
-- matches the rest of the filter. Each row's position is its finished time as text, for the
-- next batch to start after. The error text is matched as text: its LIKE wildcards escaped.
-- key_held (asked for by a dry-run retry): a PENDING or RUNNING task holds its unique key now.
SELECT t.id, coalesce(t.finished_at, t.updated_at)::text AS position, t.unique_key,
       coalesce(%(error)s::text IS NULL
                OR t.error_message ILIKE '%%' || replace(replace(replace(
                       %(error)s::text, '\', '\\'), '%%', '\%%'), '_', '\_') || '%%' ESCAPE '\',
                false)
       AND (%(id_prefix)s::text IS NULL OR starts_with(t.id, %(id_prefix)s::text))
       AND (%(name_prefix)s::text IS NULL OR starts_with(t.name, %(name_prefix)s::text))
       AND (%(unique_key)s::text IS NULL OR t.unique_key = %(unique_key)s::text) AS wanted,
       %(with_holders)s::boolean AND t.unique_key IS NOT NULL
       AND EXISTS (SELECT 1 FROM tasks AS holder
                   WHERE holder.unique_key = t.unique_key
                     AND holder.status IN ('PENDING', 'RUNNING')
                     AND holder.unique_key IS NOT NULL) AS key_held
FROM tasks AS t
WHERE t.status = %(status)s
  AND t.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
  AND t.task_type = %(task_type)s
  AND coalesce(t.finished_at, t.updated_at) >= %(since)s::timestamptz
  AND coalesce(t.finished_at, t.updated_at) < %(before)s::timestamptz
  AND (coalesce(t.finished_at, t.updated_at), t.id)
      > (%(after_position)s::timestamptz, %(after_id)s::text)
ORDER BY coalesce(t.finished_at, t.updated_at), t.id
LIMIT %(limit)s;

-- name: scan_pending_tasks
-- scan_finished_tasks for a bulk cancel: PENDING tasks of one type by when they were
-- submitted, through tasks_pending_walk_idx.
SELECT t.id, t.created_at::text AS position, t.unique_key,
       coalesce(%(error)s::text IS NULL
                OR t.error_message ILIKE '%%' || replace(replace(replace(
                       %(error)s::text, '\', '\\'), '%%', '\%%'), '_', '\_') || '%%' ESCAPE '\',
                false)
       AND (%(id_prefix)s::text IS NULL OR starts_with(t.id, %(id_prefix)s::text))
       AND (%(name_prefix)s::text IS NULL OR starts_with(t.name, %(name_prefix)s::text))
       AND (%(unique_key)s::text IS NULL OR t.unique_key = %(unique_key)s::text) AS wanted,
       false AS key_held
FROM tasks AS t
WHERE t.status = 'PENDING'
  AND t.task_type = %(task_type)s
  AND t.created_at >= %(since)s::timestamptz
  AND t.created_at < %(before)s::timestamptz
  AND (t.created_at, t.id) > (%(after_position)s::timestamptz, %(after_id)s::text)
ORDER BY t.created_at, t.id
LIMIT %(limit)s;

-- name: retry_scanned
-- A bulk retry's write for one batch: the tasks a scan found, each retried as retry_task does
-- (the same columns) if it is still in that status and window when this statement locks it.
-- A row another session holds locked is skipped rather than waited for (an operator's open
-- transaction must not stall the whole action): the caller counts it as skipped, as it does
-- a row that changed since the scan. A unique key held by a PENDING or RUNNING task refuses
-- the retry, and so does a key that an earlier task of this same batch takes back: the
-- holder check reads the statement's snapshot, in which neither is live yet, and the unique
-- index would refuse the second and fail the whole batch. A holder committed after the
-- snapshot still makes the index refuse a row: the caller runs the batch again.
WITH candidates AS (
    SELECT t.id, t.unique_key, coalesce(t.finished_at, t.updated_at) AS finished
    FROM tasks AS t
    WHERE t.id = ANY(%(ids)s::text[])
      AND t.status = %(status)s
      AND t.status IN ('FAILED', 'CANCELLED')
      AND coalesce(t.finished_at, t.updated_at) >= %(since)s::timestamptz
      AND coalesce(t.finished_at, t.updated_at) < %(before)s::timestamptz
    FOR UPDATE SKIP LOCKED
),
judged AS (
    SELECT c.id,
           c.unique_key IS NOT NULL
           AND (row_number() OVER (PARTITION BY c.unique_key ORDER BY c.finished, c.id) > 1
                OR EXISTS (SELECT 1 FROM tasks AS holder
                           WHERE holder.unique_key = c.unique_key
                             AND holder.status IN ('PENDING', 'RUNNING')
                             AND holder.unique_key IS NOT NULL)) AS key_held
    FROM candidates AS c
),
retried AS (
    UPDATE tasks AS t
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
    FROM judged
    WHERE t.id = judged.id
      AND NOT judged.key_held
    RETURNING t.id
)
SELECT (SELECT count(*) FROM retried) AS changed,
       (SELECT count(*) FROM judged WHERE judged.key_held) AS refused;

-- name: cancel_scanned
-- A bulk cancel's write for one batch: the tasks a scan found, cancelled as cancel_task
-- cancels a PENDING one, if still PENDING and in the window when locked (SKIP LOCKED: see
-- retry_scanned). A PENDING task holds no limit slot, so none is given back.
WITH candidates AS (
    SELECT t.id
    FROM tasks AS t
    WHERE t.id = ANY(%(ids)s::text[])
      AND t.status = 'PENDING'
      AND t.created_at >= %(since)s::timestamptz
      AND t.created_at < %(before)s::timestamptz
    FOR UPDATE SKIP LOCKED
)
UPDATE tasks AS t
SET
    status = 'CANCELLED',
    claimed_by = NULL,
    lease_token = NULL,
    lease_until = NULL,
    finished_at = now(),
    updated_at = now()
FROM candidates
WHERE t.id = candidates.id
RETURNING t.id;

-- name: purge_scanned
-- A bulk purge's write for one batch: the tasks a scan found, deleted if still in that
-- finished status and window when locked (SKIP LOCKED, as retention deletes).
DELETE FROM tasks AS t
WHERE t.id = ANY(ARRAY(
        SELECT c.id
        FROM tasks AS c
        WHERE c.id = ANY(%(ids)s::text[])
          AND c.status = %(status)s
          AND c.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
          AND coalesce(c.finished_at, c.updated_at) >= %(since)s::timestamptz
          AND coalesce(c.finished_at, c.updated_at) < %(before)s::timestamptz
        FOR UPDATE SKIP LOCKED))
  AND t.status = %(status)s;

-- name: pause_task_type
-- Pause a task type for every daemon: no claim that starts after this commits takes its
-- tasks (complete_and_claim reads the pause). Pausing a paused type changes nothing, so the
-- first pause's time and author stay; no row then says it was paused already.
INSERT INTO task_type_pauses (task_type, paused_by)
VALUES (%(task_type)s, %(paused_by)s)
ON CONFLICT (task_type) DO NOTHING
RETURNING task_type, paused_at, paused_by;

-- name: resume_task_type
-- Resume a paused task type, and wake idle workers for its due tasks at once rather than at
-- their next poll (pgtaskd_wake_type, migration 0007: due is their count, up to 1,000). No
-- row: the type was not paused, and nothing is sent.
WITH resumed AS (
    DELETE FROM task_type_pauses
    WHERE task_type = %(task_type)s
    RETURNING task_type, paused_at, paused_by
)
SELECT resumed.task_type, resumed.paused_at, resumed.paused_by, woken.due,
       woken.due > 0 AS notified
FROM resumed
CROSS JOIN LATERAL (SELECT pgtaskd_wake_type(resumed.task_type) AS due) AS woken;

-- name: list_pauses
-- The paused task types, each with how many of its tasks are due (and so wait for a resume),
-- counted through the claim index (staged ones: any claim stages every type's).
-- Each count stops at cap + 1 (the caller says "more than cap"): a paused type may hold a
-- backlog of millions, and stats lists every pause.
SELECT p.task_type, p.paused_at, p.paused_by,
       (SELECT count(*) FROM (SELECT 1 FROM tasks AS t
                               WHERE t.status = 'PENDING' AND t.staged
                                 AND t.task_type = p.task_type
                                 AND t.scheduled_time <= now()
                               LIMIT %(cap)s + 1) AS due) AS due_pending
FROM task_type_pauses AS p
ORDER BY p.task_type;

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

-- name: tasks_schema
-- The schema of the tasks table this connection's search_path finds.
SELECT n.nspname AS schema
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = 'tasks'::regclass;

-- name: database_now
-- The database's clock: what a scheduler pass counts due instants against, so that every
-- daemon, on any host, agrees on what is due.
SELECT now() AS now;

-- name: create_schedule_states
-- A row for each of these schedules that has none, recorded with this daemon's definition
-- and starting at the pass's now (a new schedule's first instant is the first after it).
-- Its own statement, committed before the pass locks the rows: two daemons creating the
-- same rows wait for each other here, in name order, holding nothing else; the second
-- finds the first's row and keeps it, whatever its own definition.
INSERT INTO pgtaskd_schedule_state AS s
    (name, definition, cron, timezone, through, created_at, updated_at)
SELECT v.name, v.definition, v.cron, v.timezone, %(now)s, %(now)s, %(now)s
FROM unnest(%(names)s::text[], %(definitions)s::text[], %(crons)s::text[],
            %(timezones)s::text[]) AS v(name, definition, cron, timezone)
ORDER BY v.name
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: lock_schedule_states
-- The state of these schedules, locked until the pass that read it commits: passes of other
-- daemons over the same schedules wait (in name order, so never in a cycle) and then see what
-- this one enqueued. create_schedule_states made the rows first.
SELECT name, definition, cron, timezone, through, last_enqueued, created_at, updated_at
FROM pgtaskd_schedule_state
WHERE name = ANY(%(names)s::text[])
ORDER BY name
FOR UPDATE;

-- name: schedule_reports
-- Every daemon's latest definition of these schedules (read under the state rows' locks:
-- a pass that replaces a definition writes its report in the same transaction).
SELECT name, daemon, definition, seen_at
FROM pgtaskd_schedule_daemons
WHERE name = ANY(%(names)s::text[]);

-- name: save_schedule_states
-- Record what a pass handled, in the transaction that inserted its tasks, on rows it holds
-- locked. "through" only moves forward for the same cron and time zone (a late pass never
-- moves it back); a different expression replaces it, as a fresh start, and so does a
-- through the pass found too far ahead of the clock (v.reset: see scheduling/passes.py).
UPDATE pgtaskd_schedule_state AS s SET
    through = CASE WHEN (s.cron, s.timezone) = (v.cron, v.timezone) AND isfinite(s.through)
                        AND NOT v.reset
                   THEN greatest(s.through, v.through)
                   ELSE v.through END,
    definition = v.definition,
    cron = v.cron,
    timezone = v.timezone,
    last_task_id = CASE WHEN v.last_enqueued >= s.last_enqueued
                             OR s.last_enqueued IS NULL AND v.last_enqueued IS NOT NULL
                        THEN v.last_task_id ELSE s.last_task_id END,
    last_enqueued = greatest(s.last_enqueued, v.last_enqueued),
    updated_at = %(now)s
FROM unnest(%(names)s::text[], %(definitions)s::text[], %(crons)s::text[],
            %(timezones)s::text[], %(throughs)s::timestamptz[],
            %(last_enqueued)s::timestamptz[], %(last_task_ids)s::text[],
            %(resets)s::boolean[])
     AS v(name, definition, cron, timezone, through, last_enqueued, last_task_id, reset)
WHERE s.name = v.name;

-- name: report_schedule_definitions
-- This daemon's definition of each of its schedules, as of this pass.
INSERT INTO pgtaskd_schedule_daemons AS d (name, daemon, definition, seen_at)
SELECT v.name, %(daemon)s, v.definition, %(now)s
FROM unnest(%(names)s::text[], %(definitions)s::text[]) AS v(name, definition)
ORDER BY v.name
ON CONFLICT (name, daemon) DO UPDATE SET
    definition = EXCLUDED.definition, seen_at = EXCLUDED.seen_at;

-- name: forget_schedule_reports
-- Reports of daemons gone for a day: long past TAKEOVER_AFTER, they tell nothing any more.
DELETE FROM pgtaskd_schedule_daemons
WHERE name = ANY(%(names)s::text[]) AND seen_at < %(before)s;

-- name: schedule_runs
-- For `pgtaskd schedules`: the newest instant any daemon enqueued for each of these
-- schedules, that task's status now (NULL once it was deleted), the definition in force,
-- the instant it was enqueued through (with the expression that reached it), and the daemons
-- that reported another definition within %(window)s seconds.
SELECT s.name, s.last_enqueued, s.last_task_id, t.status AS last_status,
       s.definition AS recorded_definition, s.cron, s.timezone, s.through,
       ARRAY(SELECT d.daemon FROM pgtaskd_schedule_daemons AS d
              WHERE d.name = s.name AND d.definition IS DISTINCT FROM s.definition
                AND d.seen_at > now() - make_interval(secs => %(window)s)
              ORDER BY d.daemon) AS disagreeing
FROM pgtaskd_schedule_state AS s
LEFT JOIN tasks AS t ON t.id = s.last_task_id
WHERE s.name = ANY(%(names)s::text[]);

-- name: set_task_type_limit
-- Set a global concurrency limit (migration 0007): the limit row. Its slots 1..N are made by
-- repair_limit_slots, which store.py runs next in the same transaction, from the truth (a
-- slot a RUNNING task names under a live lease is made held by it, never free while it
-- runs). Lowering a limit leaves the slots above N to be skipped by every claim, and deletes
-- those no live lease holds (a held one ends with its task, so that lowering a limit stops
-- no running task). Setting the same limit again changes nothing, so
-- the first setter's time and name stay. previous is the limit before, NULL if none.
-- Like resume_task_type it wakes idle workers when the limit grew and tasks are due, so that
-- they take the new places at once.
WITH before AS (
    SELECT (SELECT max_running FROM task_type_limits
             WHERE task_type = %(task_type)s) AS max_running
),
upserted AS (
    INSERT INTO task_type_limits (task_type, max_running, updated_by, from_claims)
    VALUES (%(task_type)s, %(max_running)s, %(updated_by)s, %(from_claims)s)
    ON CONFLICT (task_type) DO UPDATE
        SET max_running = EXCLUDED.max_running, updated_at = now(),
            updated_by = EXCLUDED.updated_by, from_claims = EXCLUDED.from_claims
        WHERE task_type_limits.max_running <> EXCLUDED.max_running
           OR task_type_limits.from_claims <> EXCLUDED.from_claims
    RETURNING task_type
),
pruned AS (
    DELETE FROM task_type_slots AS s
    WHERE s.task_type = %(task_type)s
      AND s.slot > %(max_running)s
      AND (s.task_id IS NULL OR s.lease_until <= now())
)
SELECT %(task_type)s::text AS task_type, %(max_running)s::integer AS max_running,
       before.max_running AS previous, (SELECT count(*) FROM upserted) > 0 AS changed,
       CASE WHEN before.max_running < %(max_running)s
            THEN pgtaskd_wake_type(%(task_type)s) > 0 ELSE false END AS notified
FROM before;

-- name: remove_task_type_limit
-- Remove a limit: claims stop taking slots of the type from their next statement on. Slots
-- still held stay until their tasks end (their renewals need them) and are ignored meanwhile;
-- the others go now. Notifies as a raised limit does. No row: the type had no limit.
-- The daemons' claims on it go too (%(with_claims)s, the operator's `limit TYPE off`): a
-- daemon whose config still sets it claims it again at its next start or change of limits.
WITH removed AS (
    DELETE FROM task_type_limits
    WHERE task_type = %(task_type)s
    RETURNING task_type, max_running
),
unclaimed AS (
    DELETE FROM task_type_limit_claims
    WHERE %(with_claims)s AND task_type = %(task_type)s
),
pruned AS (
    DELETE FROM task_type_slots AS s
    WHERE s.task_type IN (SELECT task_type FROM removed)
      AND (s.task_id IS NULL OR s.lease_until <= now())
)
SELECT removed.task_type, removed.max_running,
       pgtaskd_wake_type(removed.task_type) > 0 AS notified
FROM removed;

-- name: list_limits
-- The global concurrency limits, each with how many of its tasks run in its slots now
-- (running: tasks RUNNING under a live lease that hold one of its slots by their claim's
-- token, read from the task rows, not from what the slot rows say; at most max_running, more
-- only for a moment after the limit was lowered. Tasks claimed while the type had no limit
-- hold no slot and are not counted).
-- claims: each daemon's config setting ("host:config=N"), of which the smallest is in force
-- (from_claims) unless an operator set the limit since.
SELECT l.task_type, l.max_running, l.updated_at, l.updated_by,
       (SELECT count(*) FROM task_type_slots AS s
         JOIN tasks AS t ON t.id = s.task_id AND t.lease_token = s.lease_token
         WHERE s.task_type = l.task_type AND t.status = 'RUNNING'
           AND t.lease_until > now()) AS running,
       l.from_claims,
       ARRAY(SELECT c.daemon || '=' || c.max_running FROM task_type_limit_claims AS c
              WHERE c.task_type = l.task_type ORDER BY c.daemon) AS claims
FROM task_type_limits AS l
ORDER BY l.task_type;

-- name: repair_limit_slots
-- Make the slot rows of these types (%(task_types)s; NULL: every type) agree with the task
-- rows, which are the truth: run by every setting of a limit and by each reaper pass. Plain
-- SQL may delete slot rows or write any value into them (a slot held 'infinity', a holder
-- that does not exist); nothing else repairs them, and a limited type would stall for good.
-- seen: the held slot rows as this statement's snapshot has them, each with whether its
--   holder still runs under the slot's token, and the end of that holder's lease. A task
--   cancelled while it ran still runs until its handler stops (cancel_task): it holds the
--   slot its row names while the slot's lease lasts, bounded by the cancel plus the longest
--   lease a config allows (%(max_lease_seconds)s), since its own lease was cleared.
-- fixed: a slot whose claim ended, or whose task is gone, is freed; a slot whose lease ends
--   after its task's (or never) is bounded by the task's lease: a slot never outlives its
--   claim's lease. Each row is changed only as seen: a claim or a renewal that changed it
--   since the snapshot was taken (READ COMMITTED's recheck of the locked row sees the new
--   version, the seen values stay the copy this statement read) leaves it alone, so the
--   repair never frees a slot a claim has just taken, nor shortens one just renewed.
-- restored: slots 1..N missing from a limited type (deleted), recreated held by the RUNNING
--   task that names the slot under a live lease, if any, else free: the repair never makes
--   a second place for a task that still runs. The holders are looked for only when a slot
--   is missing. N is bounded by %(max_limit)s: a limit row any login may write must not
--   make a billion rows.
-- pruned: free slots above a lowered limit, as set_task_type_limit deletes them.
-- No arithmetic on a slot row's values: no value in one may abort the statement.
WITH limited AS MATERIALIZED (
    SELECT l.task_type, l.max_running, least(l.max_running, %(max_limit)s) AS wanted
    FROM task_type_limits AS l
    WHERE %(task_types)s::text[] IS NULL OR l.task_type = ANY(%(task_types)s::text[])
),
seen AS MATERIALIZED (
    SELECT s.task_type, s.slot, s.task_id, s.lease_token, s.lease_until,
           t.id IS NOT NULL AS holder_runs,
           CASE WHEN t.status = 'RUNNING' THEN coalesce(t.lease_until, '-infinity')
                -- least(..., now()): no finished_at a client wrote overflows the sum.
                ELSE least(coalesce(t.finished_at, now()), now())
                     + (%(max_lease_seconds)s * interval '1 second') END AS bound
    FROM task_type_slots AS s
    LEFT JOIN tasks AS t
      ON t.id = s.task_id
     AND ((t.status = 'RUNNING' AND t.lease_token = s.lease_token)
          OR (t.status = 'CANCELLED' AND t.task_type = s.task_type AND t.slot = s.slot
              AND s.lease_token IS NOT NULL AND s.lease_until > now()))
    WHERE s.task_id IS NOT NULL
      AND (%(task_types)s::text[] IS NULL OR s.task_type = ANY(%(task_types)s::text[]))
),
fixed AS (
    UPDATE task_type_slots AS s
    SET task_id = CASE WHEN seen.holder_runs THEN s.task_id END,
        lease_token = CASE WHEN seen.holder_runs THEN s.lease_token END,
        lease_until = CASE WHEN seen.holder_runs THEN seen.bound END
    FROM seen
    WHERE s.task_type = seen.task_type AND s.slot = seen.slot
      AND (NOT seen.holder_runs OR s.lease_until IS NULL OR s.lease_until > seen.bound)
      AND s.task_id = seen.task_id
      AND s.lease_token IS NOT DISTINCT FROM seen.lease_token
      AND s.lease_until IS NOT DISTINCT FROM seen.lease_until
    RETURNING seen.holder_runs
),
short AS MATERIALIZED (
    SELECT limited.task_type, limited.wanted FROM limited
    WHERE (SELECT count(*) FROM task_type_slots AS s
            WHERE s.task_type = limited.task_type AND s.slot <= limited.wanted)
          < limited.wanted
),
missing AS MATERIALIZED (
    SELECT short.task_type, k.slot
    FROM short
    CROSS JOIN LATERAL generate_series(1, short.wanted) AS k(slot)
    WHERE NOT EXISTS (SELECT 1 FROM task_type_slots AS s
                      WHERE s.task_type = short.task_type AND s.slot = k.slot)
),
holders AS MATERIALIZED (
    SELECT DISTINCT ON (t.task_type, t.slot) t.task_type, t.slot, t.id, t.lease_token,
           t.lease_until
    FROM tasks AS t
    WHERE EXISTS (SELECT 1 FROM missing)
      AND t.status = 'RUNNING' AND t.lease_until > now() AND t.slot > 0
      AND t.lease_token IS NOT NULL
      AND t.task_type = ANY(ARRAY(SELECT DISTINCT task_type FROM missing))
    ORDER BY t.task_type, t.slot, t.lease_until DESC
),
restored AS (
    INSERT INTO task_type_slots (task_type, slot, task_id, lease_token, lease_until)
    SELECT missing.task_type, missing.slot, holders.id, holders.lease_token,
           holders.lease_until
    FROM missing
    LEFT JOIN holders ON holders.task_type = missing.task_type AND holders.slot = missing.slot
    ON CONFLICT (task_type, slot) DO NOTHING
    RETURNING task_id
),
pruned AS (
    DELETE FROM task_type_slots AS s
    USING limited
    WHERE s.task_type = limited.task_type AND s.slot > limited.max_running
      AND s.task_id IS NULL
)
SELECT (SELECT count(*) FROM fixed WHERE NOT holder_runs) AS freed,
       (SELECT count(*) FROM fixed WHERE holder_runs) AS bounded,
       (SELECT count(*) FROM restored WHERE task_id IS NOT NULL) AS restored_held,
       (SELECT count(*) FROM restored WHERE task_id IS NULL) AS restored_free;

-- name: adopt_running_tasks
-- Setting a limit (after repair_limit_slots, in the same transaction): the tasks of the type
-- RUNNING under a live lease that hold no slot (claimed while it had no limit) take one, so
-- that they count: a free slot first, in slot order, else a new one above every slot the
-- type has (held above the limit, like the excess of a lowered one, it ends with its task).
-- A free slot a claim took since this statement read it is left alone (the recheck of the
-- locked row finds it held): its task stays without a slot.
-- locked: those tasks, their rows locked (in id order) before any slot row is written, and
--   rechecked: a claim that ended since this statement began is left out, and one that ends
--   from now on waits until this transaction has written its slot on the task row. Read
--   without the lock, a claim that ended between the read and the slot's write kept that
--   slot, named by no task row, until its lease ran out. (An end that waited here sees the
--   slot named on the row but not the slot's row, which is newer than its statement: it gives
--   the slot back right after, store.py.) No window function here: FOR UPDATE refuses one.
-- Every other statement too locks a task's row before its slot's, but a batch's end
-- (complete_and_claim's done, release_tasks) locks its rows in whatever order its plan
-- reads them: one that holds a row locked here while it waits for another can wait in a
-- cycle with this statement. store.py bounds how long this statement waits for a row
-- (bound_lock_waits) and, when it gave up, lets go of every row and starts again, so that
-- the setter gives way, not the worker.
WITH locked AS MATERIALIZED (
    SELECT t.id, t.lease_token, t.lease_until
    FROM tasks AS t
    WHERE EXISTS (SELECT 1 FROM task_type_limits AS l WHERE l.task_type = %(task_type)s)
      AND t.status = 'RUNNING' AND t.task_type = %(task_type)s AND t.slot IS NULL
      AND t.lease_until > now() AND t.lease_token IS NOT NULL
    ORDER BY t.id
    LIMIT %(max_limit)s
    FOR UPDATE OF t
),
unslotted AS MATERIALIZED (
    SELECT locked.id, locked.lease_token, locked.lease_until,
           row_number() OVER (ORDER BY locked.id) AS n
    FROM locked
),
free AS MATERIALIZED (
    SELECT s.slot, row_number() OVER (ORDER BY s.slot) AS n
    FROM task_type_slots AS s
    WHERE EXISTS (SELECT 1 FROM unslotted)
      AND s.task_type = %(task_type)s AND s.task_id IS NULL
),
placed AS MATERIALIZED (
    SELECT u.id, u.lease_token, u.lease_until, f.slot AS free_slot,
           CASE WHEN f.slot IS NULL
                THEN (SELECT coalesce(max(s.slot), 0) FROM task_type_slots AS s
                       WHERE s.task_type = %(task_type)s)
                     + u.n - (SELECT count(*) FROM free) END AS new_slot
    FROM unslotted AS u
    LEFT JOIN free AS f ON f.n = u.n
),
taken AS (
    UPDATE task_type_slots AS s
    SET task_id = p.id, lease_token = p.lease_token, lease_until = p.lease_until
    FROM placed AS p
    WHERE s.task_type = %(task_type)s AND s.slot = p.free_slot AND s.task_id IS NULL
    RETURNING s.slot, p.id
),
added AS (
    INSERT INTO task_type_slots (task_type, slot, task_id, lease_token, lease_until)
    SELECT %(task_type)s, p.new_slot, p.id, p.lease_token, p.lease_until
    FROM placed AS p
    WHERE p.new_slot BETWEEN 1 AND 2147483647
    ON CONFLICT (task_type, slot) DO NOTHING
    RETURNING slot, task_id AS id
),
adopted AS (
    UPDATE tasks AS t
    SET slot = written.slot
    FROM (SELECT slot, id FROM taken UNION ALL SELECT slot, id FROM added) AS written
    JOIN placed AS p ON p.id = written.id
    WHERE t.id = written.id AND t.status = 'RUNNING' AND t.lease_token = p.lease_token
      AND t.slot IS NULL
    RETURNING t.id
)
SELECT count(*) AS adopted FROM adopted;

-- name: bound_lock_waits
-- How long each statement of the transaction may wait for a lock from now on (SET LOCAL):
-- its setting before, to set back.
SELECT current_setting('lock_timeout') AS previous,
       set_config('lock_timeout', %(lock_timeout)s, true) AS lock_timeout;

-- name: lock_limit_claims
-- One writer of a type's claims at a time, so that each one computes the limit from every
-- claim committed before it (two daemons writing at once would each miss the other's).
-- Taken in type order by every writer, so never in a cycle.
SELECT pg_advisory_xact_lock(hashtextextended('pgtaskd task_type_limit_claims '
                                              || %(task_type)s, 0));

-- name: set_limit_claim
INSERT INTO task_type_limit_claims (task_type, daemon, max_running)
VALUES (%(task_type)s, %(daemon)s, %(max_running)s)
ON CONFLICT (task_type, daemon) DO UPDATE
    SET max_running = EXCLUDED.max_running, updated_at = now()
    WHERE task_type_limit_claims.max_running <> EXCLUDED.max_running;

-- name: drop_limit_claim
DELETE FROM task_type_limit_claims WHERE task_type = %(task_type)s AND daemon = %(daemon)s;

-- name: claimed_limit_types
-- The types this daemon claims a limit on, for a start to drop those its config no longer has.
SELECT task_type FROM task_type_limit_claims WHERE daemon = %(daemon)s ORDER BY task_type;

-- name: limit_claims_of
-- The smallest claim on a type and whose it is (the first such daemon by name), and whether
-- the limit in force came from the claims. No claim: max_running is NULL. A claim above
-- %(max_limit)s was written by hand (a config refuses it) and is not one: a billion slot
-- rows would stall every writer.
SELECT (SELECT c.max_running FROM task_type_limit_claims AS c
         WHERE c.task_type = %(task_type)s AND c.max_running <= %(max_limit)s
         ORDER BY c.max_running, c.daemon LIMIT 1) AS max_running,
       (SELECT c.daemon FROM task_type_limit_claims AS c
         WHERE c.task_type = %(task_type)s AND c.max_running <= %(max_limit)s
         ORDER BY c.max_running, c.daemon LIMIT 1) AS daemon,
       (SELECT l.from_claims FROM task_type_limits AS l
         WHERE l.task_type = %(task_type)s) AS from_claims;

-- name: heartbeat_daemon
-- A daemon's heartbeat: its row, created by the first one (started_at and heartbeat_at both
-- the database's now()) and rewritten whole by each later one. One statement, by primary
-- key, touching no indexed column: a HOT update (see migration 0013). ``registered`` says
-- this heartbeat created the row (the first, or the first after someone deleted it).
INSERT INTO pgtaskd_daemons AS d
    (id, daemon, host, pid, version, config_path, heartbeat_interval, generation, state, pools)
VALUES (%(id)s, %(daemon)s, %(host)s, %(pid)s, %(version)s, %(config_path)s, %(interval)s,
        %(generation)s, %(state)s, %(pools)s)
ON CONFLICT (id) DO UPDATE SET
    heartbeat_at = now(),
    heartbeat_interval = EXCLUDED.heartbeat_interval,
    generation = EXCLUDED.generation,
    state = EXCLUDED.state,
    pools = EXCLUDED.pools
RETURNING d.started_at = d.heartbeat_at AS registered;

-- name: sign_off_daemon
-- A daemon's last write as it stops: its row stays, as 'stopped' with no children, so that
-- an operator sees it ended cleanly (a daemon that died without a word shows as lost); both
-- kinds are pruned a day later.
UPDATE pgtaskd_daemons
SET state = 'stopped', heartbeat_at = now(), pools = '{}'
WHERE id = %(id)s;

-- name: prune_daemons
-- Rows of daemons silent for %(older_than)s seconds, by the database's clock: any daemon's
-- registry deletes them, so they go even when their own daemon never comes back. The table
-- holds a row per daemon run of the last day: a scan of it is a few pages.
DELETE FROM pgtaskd_daemons
WHERE heartbeat_at < now() - %(older_than)s * interval '1 second';

-- name: list_daemons
-- The registry for `pgtaskd daemons` and the client. ``state`` is what the daemon last said
-- of itself, or 'lost' when its heartbeat is older than %(lost_beats)s of its own intervals
-- (and at least %(lost_floor)s seconds, so that one slow statement is no loss) by the
-- database's now(); ``reported_state`` is what it said. The daemons that run come first.
SELECT *
FROM (SELECT id::text AS id, daemon, host, pid, version, config_path, started_at,
             heartbeat_at, heartbeat_interval, generation,
             CASE WHEN state <> 'stopped'
                   AND heartbeat_at < now() - greatest(%(lost_beats)s * heartbeat_interval,
                                                       %(lost_floor)s) * interval '1 second'
                  THEN 'lost' ELSE state END AS state,
             state AS reported_state,
             extract(epoch FROM now() - heartbeat_at)::float8 AS silent_seconds,
             pools
      FROM pgtaskd_daemons) AS d
WHERE %(state)s::text IS NULL OR d.state = %(state)s
ORDER BY d.state IN ('lost', 'stopped'), d.host, d.daemon, d.started_at DESC, d.id
LIMIT %(limit)s;

-- The web console (pgtaskd web) and the rollup it reads. Each console statement reads a
-- bounded number of index entries, whatever the table holds: no scan of tasks, no OFFSET,
-- no sort of more than a page's budget. The console runs them as unnamed statements (it
-- prepares nothing), so the planner sees which optional filters are NULL and plans each
-- call for the filters it has.

-- name: rollup_minutes
-- A daemon's rollup service, once a minute: one row per task type and minute into
-- pgtaskd_minute_rollup (migration 0015), for each complete minute of the last %(catch_up)s
-- not rolled up yet (usually the one that just ended), plus the whole queue's row (task
-- type '') that marks the minute done. Several daemons may run it at once: the rows are the
-- same, and the second insert of a row does nothing.
-- finished: the tasks COMPLETED or FAILED within those minutes, through tasks_finished_idx
--   (status, finished_at): the minute's own rows, never older ones.
-- depth: sampled now, for the minute that just ended: each type's due PENDING tasks (types
--   found by a loose scan of the claim's index, at most %(max_types)s; each count stops past
--   %(cap)s, marked due_at_least) and RUNNING ones (their partial index). A minute rolled up
--   late has no sample: its queue was not seen.
-- pruned: rows older than 25 hours (the console shows 24).
-- into_minute: seconds since the current minute began, by the database's clock, so that
-- the service waits for the end of this one.
WITH RECURSIVE
this AS MATERIALIZED (
    SELECT date_trunc('minute', now()) AS minute
),
missing AS MATERIALIZED (
    SELECT m.minute
    FROM this
    CROSS JOIN LATERAL generate_series(this.minute - make_interval(mins => %(catch_up)s),
                                       this.minute - interval '1 minute',
                                       interval '1 minute') AS m(minute)
    WHERE NOT EXISTS (SELECT 1 FROM pgtaskd_minute_rollup AS r
                      WHERE r.minute = m.minute AND r.task_type = '')
),
sampled AS MATERIALIZED (
    SELECT missing.minute FROM missing, this
    WHERE missing.minute = this.minute - interval '1 minute'
),
finished AS MATERIALIZED (
    SELECT date_trunc('minute', t.finished_at) AS minute, t.task_type,
           count(*) FILTER (WHERE t.status = 'COMPLETED') AS completed,
           count(*) FILTER (WHERE t.status = 'FAILED') AS failed
    FROM tasks AS t
    WHERE t.status IN ('COMPLETED', 'FAILED')
      AND t.finished_at >= (SELECT min(missing.minute) FROM missing)
      AND t.finished_at < (SELECT this.minute FROM this)
    GROUP BY 1, 2
),
due_types(task_type, n) AS (
    (SELECT t.task_type, 1 FROM tasks AS t
      WHERE EXISTS (SELECT 1 FROM sampled) AND t.status = 'PENDING' AND t.staged
      ORDER BY t.task_type LIMIT 1)
  UNION ALL
    SELECT (SELECT t.task_type FROM tasks AS t
             WHERE t.status = 'PENDING' AND t.staged AND t.task_type > d.task_type
             ORDER BY t.task_type LIMIT 1), d.n + 1
    FROM due_types AS d
    WHERE d.task_type IS NOT NULL AND d.n < %(max_types)s
),
depth AS MATERIALIZED (
    SELECT d.task_type, c.due, c.due > %(cap)s AS due_at_least
    FROM due_types AS d
    CROSS JOIN LATERAL (
        SELECT count(*) AS due
        FROM (SELECT 1 FROM tasks AS t
               WHERE t.status = 'PENDING' AND t.staged AND t.task_type = d.task_type
                 AND t.scheduled_time <= now()
               LIMIT %(cap)s + 1) AS capped) AS c
    WHERE d.task_type IS NOT NULL
),
running AS MATERIALIZED (
    SELECT t.task_type, count(*) AS running
    FROM tasks AS t
    WHERE EXISTS (SELECT 1 FROM sampled) AND t.status = 'RUNNING'
    GROUP BY t.task_type
),
typed AS MATERIALIZED (
    SELECT parts.minute, parts.task_type, sum(parts.completed) AS completed,
           sum(parts.failed) AS failed, max(parts.due) AS due,
           bool_or(parts.due_at_least) AS due_at_least, max(parts.running) AS running
    FROM (
        SELECT f.minute, f.task_type, f.completed, f.failed, NULL::bigint AS due,
               false AS due_at_least, NULL::bigint AS running
        FROM finished AS f
        WHERE f.minute IN (SELECT missing.minute FROM missing)
        UNION ALL
        SELECT sampled.minute, depth.task_type, 0, 0, depth.due, depth.due_at_least, NULL
        FROM sampled CROSS JOIN depth
        WHERE depth.due > 0
        UNION ALL
        SELECT sampled.minute, running.task_type, 0, 0, NULL, false, running.running
        FROM sampled CROSS JOIN running
    ) AS parts
    GROUP BY parts.minute, parts.task_type
),
whole AS (
    SELECT missing.minute, '' AS task_type,
           coalesce((SELECT sum(typed.completed) FROM typed
                      WHERE typed.minute = missing.minute), 0) AS completed,
           coalesce((SELECT sum(typed.failed) FROM typed
                      WHERE typed.minute = missing.minute), 0) AS failed,
           CASE WHEN missing.minute IN (SELECT sampled.minute FROM sampled)
                THEN (SELECT coalesce(sum(depth.due), 0) FROM depth) END AS due,
           missing.minute IN (SELECT sampled.minute FROM sampled)
               AND (coalesce((SELECT bool_or(depth.due_at_least) FROM depth), false)
                    OR (SELECT count(*) FROM depth) >= %(max_types)s) AS due_at_least,
           CASE WHEN missing.minute IN (SELECT sampled.minute FROM sampled)
                THEN (SELECT coalesce(sum(running.running), 0) FROM running) END AS running
    FROM missing
),
written AS (
    INSERT INTO pgtaskd_minute_rollup (minute, task_type, completed, failed, due,
                                       due_at_least, running)
    SELECT rows.minute, rows.task_type, least(rows.completed, 2147483647),
           least(rows.failed, 2147483647),
           CASE WHEN rows.due IS NOT NULL THEN least(rows.due, 2147483647) END,
           rows.due_at_least,
           CASE WHEN rows.running IS NOT NULL THEN least(rows.running, 2147483647) END
    FROM (SELECT * FROM typed UNION ALL SELECT * FROM whole) AS rows
    ON CONFLICT (minute, task_type) DO NOTHING
    RETURNING minute, task_type
),
pruned AS (
    DELETE FROM pgtaskd_minute_rollup AS r
    WHERE r.minute < (SELECT this.minute FROM this) - interval '25 hours'
)
SELECT (SELECT count(*) FROM written WHERE task_type = '') AS minutes_written,
       extract(epoch FROM now() - (SELECT this.minute FROM this))::float8 AS into_minute;

-- name: console_overview
-- The console's overview: one row per task type (at most %(max_types)s, by name) that has
-- PENDING or RUNNING tasks, finished ones in the last 24 h of the rollup, a pause, a limit,
-- or a handler in the console's config (%(known_types)s).
-- The types with PENDING tasks are found by a loose scan of each PENDING index (one probe
-- per type); each count reads at most %(cap)s + 1 index entries (the caller says "at least"
-- past it); RUNNING tasks are few (bounded by the workers) and read through their index.
-- due / soon: staged rows (migration 0010) whose time has come, or comes within a second;
-- later: the rest, through tasks_future_type_idx (migration 0015).
-- oldest_due: each priority level's first staged row by time (at most %(max_levels)s
-- levels, highest first), the oldest of those that are due: exact unless a type has more
-- levels than that.
-- failed_24h / completed_1h: from the rollup, through the last complete minute.
-- slots_in_use: the limit's slots held by a task RUNNING under a live lease (as list_limits).
WITH RECURSIVE
due_types(task_type, n) AS (
    (SELECT t.task_type, 1 FROM tasks AS t
      WHERE t.status = 'PENDING' AND t.staged
      ORDER BY t.task_type LIMIT 1)
  UNION ALL
    SELECT (SELECT t.task_type FROM tasks AS t
             WHERE t.status = 'PENDING' AND t.staged AND t.task_type > d.task_type
             ORDER BY t.task_type LIMIT 1), d.n + 1
    FROM due_types AS d
    WHERE d.task_type IS NOT NULL AND d.n < %(max_types)s
),
later_types(task_type, n) AS (
    (SELECT t.task_type, 1 FROM tasks AS t
      WHERE t.status = 'PENDING' AND NOT t.staged
      ORDER BY t.task_type LIMIT 1)
  UNION ALL
    SELECT (SELECT t.task_type FROM tasks AS t
             WHERE t.status = 'PENDING' AND NOT t.staged AND t.task_type > l.task_type
             ORDER BY t.task_type LIMIT 1), l.n + 1
    FROM later_types AS l
    WHERE l.task_type IS NOT NULL AND l.n < %(max_types)s
),
running AS MATERIALIZED (
    SELECT t.task_type, count(*) AS running,
           count(*) FILTER (WHERE t.lease_until <= now()) AS expired
    FROM tasks AS t
    WHERE t.status = 'RUNNING'
    GROUP BY t.task_type
),
recent AS MATERIALIZED (
    SELECT r.task_type, sum(r.failed) AS failed_24h,
           coalesce(sum(r.completed) FILTER (
               WHERE r.minute >= date_trunc('minute', now()) - interval '60 minutes'), 0)
               AS completed_1h
    FROM pgtaskd_minute_rollup AS r
    WHERE r.minute >= date_trunc('minute', now()) - interval '24 hours'
      AND r.task_type <> ''
    GROUP BY r.task_type
),
types AS MATERIALIZED (
    SELECT DISTINCT every_source.task_type
    FROM (SELECT task_type FROM due_types
          UNION ALL SELECT task_type FROM later_types
          UNION ALL SELECT task_type FROM running
          UNION ALL SELECT task_type FROM recent
          UNION ALL SELECT task_type FROM task_type_pauses
          UNION ALL SELECT task_type FROM task_type_limits
          UNION ALL SELECT unnest(%(known_types)s::text[])) AS every_source
    WHERE every_source.task_type IS NOT NULL
    ORDER BY every_source.task_type
    LIMIT %(max_types)s
)
SELECT types.task_type,
       staged.due, staged.soon, staged.seen > %(cap)s AS due_at_least,
       later.seen AS later, later.seen > %(cap)s AS later_at_least,
       coalesce(running.running, 0) AS running, coalesce(running.expired, 0) AS expired,
       coalesce(recent.failed_24h, 0) AS failed_24h,
       coalesce(recent.completed_1h, 0) AS completed_1h,
       oldest.due_since,
       CASE WHEN oldest.due_since IS NOT NULL
            THEN extract(epoch FROM now() - greatest(oldest.due_since, '0001-01-01 00:00Z'))::float8
       END AS oldest_due_age,
       pause.paused_at, pause.paused_by,
       lim.max_running, slots.in_use AS slots_in_use
FROM types
LEFT JOIN running ON running.task_type = types.task_type
LEFT JOIN recent ON recent.task_type = types.task_type
LEFT JOIN task_type_pauses AS pause ON pause.task_type = types.task_type
LEFT JOIN task_type_limits AS lim ON lim.task_type = types.task_type
CROSS JOIN LATERAL (
    SELECT count(*) AS seen,
           count(*) FILTER (WHERE capped.scheduled_time <= now()) AS due,
           count(*) FILTER (WHERE capped.scheduled_time > now()) AS soon
    FROM (SELECT t.scheduled_time FROM tasks AS t
           WHERE t.status = 'PENDING' AND t.staged AND t.task_type = types.task_type
           LIMIT %(cap)s + 1) AS capped) AS staged
CROSS JOIN LATERAL (
    SELECT count(*) AS seen
    FROM (SELECT 1 FROM tasks AS t
           WHERE t.status = 'PENDING' AND NOT t.staged AND t.task_type = types.task_type
           LIMIT %(cap)s + 1) AS capped) AS later
LEFT JOIN LATERAL (
    WITH RECURSIVE type_levels(priority, n) AS (
        (SELECT t.priority, 1 FROM tasks AS t
          WHERE t.status = 'PENDING' AND t.staged AND t.task_type = types.task_type
          ORDER BY t.priority DESC LIMIT 1)
      UNION ALL
        SELECT (SELECT t.priority FROM tasks AS t
                 WHERE t.status = 'PENDING' AND t.staged AND t.task_type = types.task_type
                   AND t.priority < type_levels.priority
                 ORDER BY t.priority DESC LIMIT 1), type_levels.n + 1
        FROM type_levels
        WHERE type_levels.priority IS NOT NULL AND type_levels.n < %(max_levels)s
    )
    SELECT min(first_row.scheduled_time) AS due_since
    FROM type_levels
    CROSS JOIN LATERAL (
        SELECT t.scheduled_time FROM tasks AS t
        WHERE t.status = 'PENDING' AND t.staged AND t.task_type = types.task_type
          AND t.priority = type_levels.priority
        ORDER BY t.scheduled_time LIMIT 1) AS first_row
    WHERE type_levels.priority IS NOT NULL AND first_row.scheduled_time <= now()
) AS oldest ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS in_use
    FROM task_type_slots AS s
    JOIN tasks AS t ON t.id = s.task_id AND t.lease_token = s.lease_token
    WHERE lim.task_type IS NOT NULL AND s.task_type = types.task_type
      AND t.status = 'RUNNING' AND t.lease_until > now()
) AS slots ON true
ORDER BY types.task_type;

-- name: console_activity
-- The console's charts: the whole queue's rollup row of each of the last %(minutes)s
-- complete minutes, NULLs where no daemon rolled the minute up.
SELECT m.minute, r.completed, r.failed, r.due, r.due_at_least, r.running
FROM generate_series(date_trunc('minute', now()) - make_interval(mins => %(minutes)s),
                     date_trunc('minute', now()) - interval '1 minute',
                     interval '1 minute') AS m(minute)
LEFT JOIN pgtaskd_minute_rollup AS r ON r.minute = m.minute AND r.task_type = ''
ORDER BY m.minute;

-- name: console_pending
-- The console's PENDING tasks in the order claims take them: first the staged ones (due, or
-- due within a second) by priority, due time and age, read as complete_and_claim reads them
-- (the priority levels, highest first, then each type's rows of a level, merged); then those
-- due later, soonest first (through tasks_future_type_idx for one type, tasks_unstaged_idx
-- for all). One type (%(task_type)s) or every type with staged rows (a loose scan, at most
-- %(max_types)s).
-- Keyset: only rows after the key of the last row shown (the after_ parameters; phase 'due' or
-- 'later'; NULL for the first page). At most %(scan)s rows are read (scanned); the residual
-- filters (prefixes of the id and the name, a unique key, a text in the error) keep some,
-- and the caller pages on from the last one read when fewer than a page matched.
-- Rows: the matches in order (at most %(page)s + 1), then, when the budget ran out, the last
-- row read (scan_end). sort_key is what the next page's after_* are made of.
WITH RECURSIVE
every_type(task_type, n) AS (
    (SELECT t.task_type, 1 FROM tasks AS t
      WHERE %(task_type)s::text IS NULL AND t.status = 'PENDING' AND t.staged
      ORDER BY t.task_type LIMIT 1)
  UNION ALL
    SELECT (SELECT t.task_type FROM tasks AS t
             WHERE t.status = 'PENDING' AND t.staged AND t.task_type > e.task_type
             ORDER BY t.task_type LIMIT 1), e.n + 1
    FROM every_type AS e
    WHERE e.task_type IS NOT NULL AND e.n < %(max_types)s
),
types(task_type) AS MATERIALIZED (
    SELECT %(task_type)s::text WHERE %(task_type)s::text IS NOT NULL
    UNION ALL
    SELECT e.task_type FROM every_type AS e WHERE e.task_type IS NOT NULL
),
levels(priority) AS (
    SELECT max(top.priority)
    FROM types
    CROSS JOIN LATERAL (
        SELECT t.priority FROM tasks AS t
        WHERE t.status = 'PENDING' AND t.staged AND t.task_type = types.task_type
          AND t.priority <= coalesce(%(after_priority)s::integer, 2147483647)
        ORDER BY t.priority DESC
        LIMIT 1) AS top
    WHERE %(after_phase)s::text IS DISTINCT FROM 'later'
  UNION ALL
    SELECT (SELECT max(top.priority)
            FROM types
            CROSS JOIN LATERAL (
                SELECT t.priority FROM tasks AS t
                WHERE t.status = 'PENDING' AND t.staged AND t.task_type = types.task_type
                  AND t.priority < levels.priority
                ORDER BY t.priority DESC
                LIMIT 1) AS top)
    FROM levels
    WHERE levels.priority IS NOT NULL
),
due_rows AS (
    SELECT level_rows.*
    FROM levels
    CROSS JOIN LATERAL (
        SELECT r.*
        FROM types
        CROSS JOIN LATERAL (
            SELECT t.id, t.name, t.task_type, t.status, t.priority, t.scheduled_time,
                   t.created_at, t.updated_at, t.started_at, t.finished_at, t.retry_count,
                   t.max_retries, t.attempts, t.claimed_by, t.lease_until, t.unique_key,
                   t.error_message
            FROM tasks AS t
            WHERE t.status = 'PENDING' AND t.staged AND t.task_type = types.task_type
              AND t.priority = levels.priority
              AND (t.scheduled_time, t.created_at, t.id) >
                  (CASE WHEN levels.priority = %(after_priority)s::integer
                        THEN %(after_time)s::timestamptz ELSE '-infinity' END,
                   CASE WHEN levels.priority = %(after_priority)s::integer
                        THEN %(after_created)s::timestamptz ELSE '-infinity' END,
                   CASE WHEN levels.priority = %(after_priority)s::integer
                        THEN %(after_id)s::text ELSE '' END)
            ORDER BY t.scheduled_time, t.created_at, t.id
            LIMIT %(scan)s) AS r
        ORDER BY r.scheduled_time, r.created_at, r.id
        LIMIT %(scan)s) AS level_rows
    WHERE levels.priority IS NOT NULL
),
later_rows AS (
    SELECT t.id, t.name, t.task_type, t.status, t.priority, t.scheduled_time, t.created_at,
           t.updated_at, t.started_at, t.finished_at, t.retry_count, t.max_retries,
           t.attempts, t.claimed_by, t.lease_until, t.unique_key, t.error_message
    FROM tasks AS t
    WHERE t.status = 'PENDING' AND NOT t.staged
      AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s::text)
      AND (t.scheduled_time, t.id) >
          (CASE WHEN %(after_phase)s::text = 'later'
                THEN %(after_time)s::timestamptz ELSE '-infinity' END,
           CASE WHEN %(after_phase)s::text = 'later' THEN %(after_id)s::text ELSE '' END)
    ORDER BY t.scheduled_time, t.id
    LIMIT %(scan)s
),
scanned AS MATERIALIZED (
    SELECT both_parts.*,
           json_build_array(CASE WHEN both_parts.phase = 0 THEN 'due' ELSE 'later' END,
                            both_parts.priority, both_parts.scheduled_time,
                            both_parts.created_at, both_parts.id) AS sort_key
    FROM (SELECT 0 AS phase, d.* FROM (SELECT * FROM due_rows LIMIT %(scan)s) AS d
          UNION ALL
          SELECT 1 AS phase, l.* FROM later_rows AS l) AS both_parts
    LIMIT %(scan)s
),
matched AS (
    SELECT s.* FROM scanned AS s
    WHERE (%(id_prefix)s::text IS NULL OR starts_with(s.id, %(id_prefix)s::text))
      AND (%(name_prefix)s::text IS NULL OR starts_with(s.name, %(name_prefix)s::text))
      AND (%(unique_key)s::text IS NULL OR s.unique_key = %(unique_key)s::text)
      AND (%(error)s::text IS NULL
           OR strpos(lower(s.error_message), lower(%(error)s::text)) > 0)
    ORDER BY s.phase, CASE WHEN s.phase = 0 THEN -s.priority::bigint END, s.scheduled_time,
             CASE WHEN s.phase = 0 THEN s.created_at END, s.id
    LIMIT %(page)s + 1
),
scan_end AS (
    SELECT s.* FROM scanned AS s
    WHERE (SELECT count(*) FROM scanned) >= %(scan)s
    ORDER BY s.phase DESC, CASE WHEN s.phase = 0 THEN -s.priority::bigint END DESC,
             s.scheduled_time DESC, CASE WHEN s.phase = 0 THEN s.created_at END DESC,
             s.id DESC
    LIMIT 1
)
SELECT listed.* FROM (
    SELECT m.*, false AS scan_end FROM matched AS m
    UNION ALL
    SELECT e.*, true AS scan_end FROM scan_end AS e) AS listed
ORDER BY listed.scan_end, listed.phase,
         CASE WHEN listed.phase = 0 THEN -listed.priority::bigint END, listed.scheduled_time,
         CASE WHEN listed.phase = 0 THEN listed.created_at END, listed.id;

-- name: console_running
-- The console's RUNNING tasks, most recently started first: every RUNNING row is read
-- through tasks_lease_idx (they are bounded by the workers), the type in the index scan's
-- filter. Keyset, budget and rows as console_pending.
WITH scanned AS MATERIALIZED (
    SELECT 0 AS phase, t.id, t.name, t.task_type, t.status, t.priority, t.scheduled_time,
           t.created_at, t.updated_at, t.started_at, t.finished_at, t.retry_count,
           t.max_retries, t.attempts, t.claimed_by, t.lease_until, t.unique_key,
           t.error_message,
           json_build_array('running', coalesce(t.started_at, '-infinity'), t.id) AS sort_key
    FROM tasks AS t
    WHERE t.status = 'RUNNING' AND t.lease_until IS NOT NULL
      AND (%(task_type)s::text IS NULL OR t.task_type = %(task_type)s::text)
      AND (%(after_time)s::timestamptz IS NULL
           OR (coalesce(t.started_at, '-infinity'), t.id)
              < (%(after_time)s::timestamptz, %(after_id)s::text))
    ORDER BY coalesce(t.started_at, '-infinity') DESC, t.id DESC
    LIMIT %(scan)s
),
matched AS (
    SELECT s.* FROM scanned AS s
    WHERE (%(id_prefix)s::text IS NULL OR starts_with(s.id, %(id_prefix)s::text))
      AND (%(name_prefix)s::text IS NULL OR starts_with(s.name, %(name_prefix)s::text))
      AND (%(unique_key)s::text IS NULL OR s.unique_key = %(unique_key)s::text)
      AND (%(error)s::text IS NULL
           OR strpos(lower(s.error_message), lower(%(error)s::text)) > 0)
    ORDER BY coalesce(s.started_at, '-infinity') DESC, s.id DESC
    LIMIT %(page)s + 1
),
scan_end AS (
    SELECT s.* FROM scanned AS s
    WHERE (SELECT count(*) FROM scanned) >= %(scan)s
    ORDER BY coalesce(s.started_at, '-infinity'), s.id
    LIMIT 1
)
SELECT listed.* FROM (
    SELECT m.*, false AS scan_end FROM matched AS m
    UNION ALL
    SELECT e.*, true AS scan_end FROM scan_end AS e) AS listed
ORDER BY listed.scan_end, coalesce(listed.started_at, '-infinity') DESC, listed.id DESC;

-- name: console_finished
-- The console's tasks of one finished status, most recently finished first, through
-- tasks_finished_idx (status, finished_at) read backwards from the key of the last row
-- shown. A type is a residual filter here like the texts: no index of finished rows has
-- the type (every final write would pay for one), so a rare type among millions of
-- finished tasks is found a budget of rows at a time, never by reading them all at once.
-- A row marked finished by hand without a finished_at is not listed (retention ages it by
-- updated_at). Keyset, budget and rows as console_pending.
WITH scanned AS MATERIALIZED (
    SELECT 0 AS phase, t.id, t.name, t.task_type, t.status, t.priority, t.scheduled_time,
           t.created_at, t.updated_at, t.started_at, t.finished_at, t.retry_count,
           t.max_retries, t.attempts, t.claimed_by, t.lease_until, t.unique_key,
           t.error_message,
           json_build_array('finished', t.finished_at, t.id) AS sort_key
    FROM tasks AS t
    WHERE t.status = %(status)s::text AND t.status IN ('COMPLETED', 'FAILED', 'CANCELLED')
      AND t.finished_at IS NOT NULL
      AND (%(after_time)s::timestamptz IS NULL
           OR (t.finished_at, t.id) < (%(after_time)s::timestamptz, %(after_id)s::text))
    ORDER BY t.finished_at DESC, t.id DESC
    LIMIT %(scan)s
),
matched AS (
    SELECT s.* FROM scanned AS s
    WHERE (%(task_type)s::text IS NULL OR s.task_type = %(task_type)s::text)
      AND (%(id_prefix)s::text IS NULL OR starts_with(s.id, %(id_prefix)s::text))
      AND (%(name_prefix)s::text IS NULL OR starts_with(s.name, %(name_prefix)s::text))
      AND (%(unique_key)s::text IS NULL OR s.unique_key = %(unique_key)s::text)
      AND (%(error)s::text IS NULL
           OR strpos(lower(s.error_message), lower(%(error)s::text)) > 0)
    ORDER BY s.finished_at DESC, s.id DESC
    LIMIT %(page)s + 1
),
scan_end AS (
    SELECT s.* FROM scanned AS s
    WHERE (SELECT count(*) FROM scanned) >= %(scan)s
    ORDER BY s.finished_at, s.id
    LIMIT 1
)
SELECT listed.* FROM (
    SELECT m.*, false AS scan_end FROM matched AS m
    UNION ALL
    SELECT e.*, true AS scan_end FROM scan_end AS e) AS listed
ORDER BY listed.scan_end, listed.finished_at DESC, listed.id DESC;

-- name: console_live_key_holder
-- The console's tasks filtered by a unique key among PENDING or RUNNING tasks: the one task
-- that holds it, through tasks_live_unique_key_idx.
SELECT 0 AS phase, t.id, t.name, t.task_type, t.status, t.priority, t.scheduled_time,
       t.created_at, t.updated_at, t.started_at, t.finished_at, t.retry_count, t.max_retries,
       t.attempts, t.claimed_by, t.lease_until, t.unique_key, t.error_message,
       NULL::json AS sort_key, false AS scan_end
FROM tasks AS t
WHERE t.unique_key = %(unique_key)s::text AND t.unique_key IS NOT NULL
  AND t.status IN ('PENDING', 'RUNNING') AND t.status = %(status)s::text;

-- name: console_task
-- One task for the console's page: every column, with the lease left by the database's
-- clock (negative once it ran out) and that clock.
SELECT t.*, CASE WHEN isfinite(t.lease_until)
                 THEN extract(epoch FROM t.lease_until - now())::float8 END AS lease_left,
       now() AS database_now
FROM tasks AS t
WHERE t.id = %(task_id)s;

-- name: web_bench_fill
-- pgtaskd web-bench: %(count)s tasks numbered from %(first)s into the bench's own schema,
-- in one statement: finished ones (%(kind)s 'finished': 90 per cent COMPLETED, 8 FAILED with an
-- error, 2 CANCELLED, over the last week), PENDING ones ('pending': nine in ten due within
-- the last hour over five priorities, the rest due within the next day), or RUNNING ones
-- ('running', under a live lease), spread over %(types)s task types.
INSERT INTO tasks (id, name, task_type, status, priority, scheduled_time, created_at,
                   finished_at, started_at, error_message, claimed_by, lease_until,
                   lease_token, unique_key)
SELECT %(kind)s || '-' || g, 'bench ' || g, 'type' || (g %% %(types)s::integer),
       CASE %(kind)s
           WHEN 'pending' THEN 'PENDING' WHEN 'running' THEN 'RUNNING'
           ELSE CASE WHEN g %% 50 = 0 THEN 'CANCELLED' WHEN g %% 50 < 5 THEN 'FAILED'
                     ELSE 'COMPLETED' END END,
       CASE WHEN %(kind)s = 'pending' THEN g %% 5 ELSE 0 END,
       CASE WHEN %(kind)s = 'pending' AND g %% 10 = 0
            THEN now() + (g %% 86400) * interval '1 second'
            ELSE now() - (g %% 3600) * interval '1 second' END,
       now() - interval '1 hour',
       CASE WHEN %(kind)s = 'finished' THEN now() - (g %% 604800) * interval '1 second' END,
       CASE WHEN %(kind)s <> 'pending' THEN now() - (g %% 600) * interval '1 second' END,
       CASE WHEN %(kind)s = 'finished' AND g %% 50 BETWEEN 1 AND 4
            THEN 'ValueError: row ' || g || ' refused by the upstream' END,
       CASE WHEN %(kind)s = 'running' THEN 'bench:' || g END,
       CASE WHEN %(kind)s = 'running' THEN now() + interval '1 hour' END,
       CASE WHEN %(kind)s = 'running' THEN g END,
       CASE WHEN g %% 100 = 0 THEN %(kind)s || '-key-' || g END
FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(count)s - 1) AS g;
