-- The daemon registry (issue 17.2): every running daemon's row, written by its own registry
-- thread (maintenance/registry.py), read by `pgtaskd daemons` and the client.
-- pgtaskd: older daemons may run on this
--
-- Older daemons never read or write this table: they simply do not appear in it.
--
-- A row is one run of a daemon. ``daemon`` is the identity the daemons already share in the
-- limit claims and the schedule reports (host and config file: the same after a restart);
-- ``id`` is drawn by the process at start, so two runs of one config (a restart, or two
-- started by mistake) are two rows, told apart by pid and started_at too. Times are the
-- database's: a daemon is lost when its heartbeat is older than a few of its own intervals
-- by the database's now(), whatever the hosts' clocks say.
--
-- Each daemon rewrites its row every few seconds (one UPSERT by primary key, see
-- heartbeat_daemon in queries.sql): no other column is indexed, and pages are left half
-- empty, so that each rewrite is a HOT update that writes no index entry.
CREATE TABLE pgtaskd_daemons (
    id UUID PRIMARY KEY,
    daemon TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    version TEXT NOT NULL,
    -- NULL for a daemon run without a config file (the built-in defaults).
    config_path TEXT,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Seconds between its heartbeats: the lost threshold is a multiple of the daemon's own.
    heartbeat_interval DOUBLE PRECISION NOT NULL CHECK (heartbeat_interval > 0),
    generation INTEGER NOT NULL,
    -- What the daemon said of itself at its last heartbeat ('stopped': it signed off).
    state TEXT NOT NULL
        CHECK (state IN ('starting', 'running', 'reloading', 'stopping', 'stopped')),
    -- Pool name -> its children, each with the tasks it holds (see daemon/snapshot.py).
    -- json, not jsonb: written far more often than read, and kept in the order written.
    pools JSON NOT NULL DEFAULT '{}'
) WITH (fillfactor = 50);
