-- The tasks table of the seed design, every column with the seed's name and type.
-- Columns the seed leaves without a default get one, so that a row inserted by any client
-- with only (id, name, task_type, payload) is a valid, due, pending task.
CREATE TABLE tasks (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    task_type TEXT NOT NULL,
    payload JSONB NOT NULL DEFAULT '{}'::jsonb,
    priority INTEGER NOT NULL DEFAULT 0,
    scheduled_time TIMESTAMPTZ NOT NULL DEFAULT now(),
    status TEXT NOT NULL DEFAULT 'PENDING'
        CONSTRAINT tasks_status_check
        CHECK (status IN ('PENDING', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    retry_count INTEGER NOT NULL DEFAULT 0 CONSTRAINT tasks_retry_count_check CHECK (retry_count >= 0),
    max_retries INTEGER NOT NULL DEFAULT 3 CONSTRAINT tasks_max_retries_check CHECK (max_retries >= 0),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    claimed_by TEXT,
    lease_until TIMESTAMPTZ,
    error_message TEXT,
    -- Added by pgtaskd. The fencing token: a fresh value per claim, required by every later
    -- write of that claim's owner, so an owner that lost its lease can never write again,
    -- even if the same worker id claims the same task later.
    lease_token BIGINT,
    -- How many times the task was claimed (runs started), whatever their outcome.
    attempts INTEGER NOT NULL DEFAULT 0,
    started_at TIMESTAMPTZ,
    finished_at TIMESTAMPTZ,
    -- A running task always names its owner: the ownership checks depend on it.
    CONSTRAINT tasks_running_has_owner CHECK (status <> 'RUNNING' OR claimed_by IS NOT NULL)
);

CREATE SEQUENCE pgtaskd_lease_token_seq AS BIGINT;

-- Serves the claim's ORDER BY. It covers RUNNING rows too because the seed's claim also takes
-- RUNNING tasks whose lease expired; an index on PENDING alone does not serve that OR and the
-- planner falls back to reading and sorting the whole table.
CREATE INDEX tasks_claim_order_idx
    ON tasks (priority DESC, scheduled_time ASC, created_at ASC)
    WHERE status IN ('PENDING', 'RUNNING');

-- Serves the lease reaper and the expired-lease health check.
CREATE INDEX tasks_lease_idx ON tasks (lease_until) WHERE status = 'RUNNING';

-- Listing and stats by type and status for operators.
CREATE INDEX tasks_status_type_idx ON tasks (status, task_type);

-- Capped exponential backoff with jitter, in one place for the worker, the reaper and the
-- supervisor's rescue of a dead child's task:
--   min(base * 2^retry_count, max) * (1 + random() * jitter)
-- The exponent is capped so that a huge retry_count cannot overflow float8.
CREATE FUNCTION pgtaskd_backoff(retry_count INTEGER, base_delay DOUBLE PRECISION,
                                max_delay DOUBLE PRECISION, jitter DOUBLE PRECISION)
RETURNS INTERVAL
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
    SELECT make_interval(secs => least(base_delay * power(2::double precision, least(retry_count, 62)),
                                       max_delay)
                                 * (1 + random() * jitter))
$$;
