"""The connection pools of a worker: its own, and the one its handlers borrow from."""

from __future__ import annotations

import psycopg
from psycopg_pool import ConnectionPool

from ..db.connect import with_options

# How long the pool retries one lost connection before it gives the attempt up. psycopg_pool
# doubles the wait between tries without a cap (1, 2, 4 ... s), so an attempt kept going
# through a long outage could sleep for minutes after the database came back (measured: 9.9 s
# after a 45 s outage). Given up, the attempt frees its slot, and the worker's next checkout
# starts a fresh one, trying at once; the worker's own backoff, cut short by the wake relay
# when it reaches the database, paces those checkouts.
RECONNECT_WINDOW = 5.0


def open_pool(dsn: str, *, connect_timeout: float, name: str, max_size: int = 2,
              min_size: int = 1, application_name: str | None = None,
              generic_plans: bool = True, pooled: bool = False) -> ConnectionPool:
    """The worker's own connections: the loop's claims and final writes, the batch guard.

    ``generic_plans``: the claim is one prepared statement whose plan PostgreSQL would
    otherwise make afresh on every call (its estimates for a parameter LIMIT make the
    generic plan look dear), which costs more than running it. Written so that its generic
    plan is as good (every row reached by primary key or an ordered index scan), it is
    planned once per connection. Measured here: 690 us of server CPU per claim-and-complete
    with custom plans, 280 us with the generic one. Handlers get connections of another pool
    (Worker.handler_connection), without this setting.

    ``pooled``: the DSN goes through a transaction pooler (database.transaction_pooler): no
    prepared statements, and no session setting, which would leak to the pooler's other
    clients; every claim is then planned afresh.

    No ``check`` before lending: testing every checkout costs a round trip per task. A
    connection that died (a database restart) fails its next statement instead; the pool
    drops it when it comes back broken, the loop logs one loop_error and the next claim gets
    a fresh connection, and final writes retry on their own.
    """
    return ConnectionPool(
        with_options(dsn, application_name=(application_name or name)[:63],
                     connect_timeout=max(1, int(connect_timeout))),
        min_size=min_size, max_size=max_size,
        kwargs={"autocommit": True, **({"prepare_threshold": None} if pooled else {})},
        configure=use_generic_plans if generic_plans and not pooled else None,
        timeout=connect_timeout, open=False, name=name,
        reconnect_timeout=RECONNECT_WINDOW,
    )


def use_generic_plans(conn: psycopg.Connection) -> None:
    conn.execute("SET plan_cache_mode = force_generic_plan")
    # A generic plan's estimates for a parameter LIMIT are far above what it reads; on a
    # table of millions of rows they pass jit_above_cost, and compiling the claim took 21 ms
    # a call where running it took 0.5. These statements never gain from JIT.
    conn.execute("SET jit = off")
