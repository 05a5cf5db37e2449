-- Daemons whose configs disagree (migration 0008 belongs to another branch; versions are
-- applied by number, whatever order they arrive in).
--
-- Schedules: the state row records the definition it is kept with (a hash of cron, time
-- zone, task type, payload and options), so that a daemon with another definition of the
-- same name can tell and stay out, instead of enqueueing its own instants in turn.
-- NULL on rows written before this migration: the first pass records its daemon's.
ALTER TABLE pgtaskd_schedule_state
    ADD COLUMN definition TEXT,
    -- The pass that created the row: a new schedule's first instant is the first after it.
    ADD COLUMN created_at TIMESTAMPTZ NOT NULL DEFAULT now();

-- Each daemon's definition of each schedule, as of its latest pass: who agrees with the
-- recorded definition, who does not (each daemon that sees a disagreement logs it, and
-- `pgtaskd schedules` shows it), and whether any daemon still holds the recorded definition.
-- A daemon is its host and config file: the same after a reload and after a restart.
CREATE TABLE pgtaskd_schedule_daemons (
    name TEXT NOT NULL,
    daemon TEXT NOT NULL,
    definition TEXT NOT NULL,
    seen_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (name, daemon)
);

-- Limits: each daemon's config claims its limits here; task_type_limits holds the one in
-- force, the smallest claim (from_claims), unless an operator set it with `pgtaskd limit`
-- since. A daemon removing its line removes only its own claim.
CREATE TABLE task_type_limit_claims (
    task_type TEXT NOT NULL,
    daemon TEXT NOT NULL,
    max_running INTEGER NOT NULL CHECK (max_running > 0),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (task_type, daemon)
);

ALTER TABLE task_type_limits ADD COLUMN from_claims BOOLEAN NOT NULL DEFAULT false;
