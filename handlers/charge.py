"""An idempotent external effect: charge an account exactly once per task, however many
times the task runs.

pgtaskd runs a task at least once, not exactly once: a worker can finish the charge and die
before it records COMPLETED, and the task then runs again. So the handler records the
operation under a unique key (the task id) in the same transaction as the effect itself. A
second run finds the key taken and changes nothing.

Payload: {"account": "acme", "amount_cents": 1250}
"""

from supervisor import PermanentError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS example_accounts (
    account TEXT PRIMARY KEY,
    balance_cents BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS example_charges (
    operation_id TEXT PRIMARY KEY,          -- the task id: the idempotency key
    account TEXT NOT NULL,
    amount_cents BIGINT NOT NULL,
    charged_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
"""


def _ensure_schema(conn):
    with conn.transaction():
        # Two workers creating the same tables at once would collide in the catalog.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('pgtaskd example charge schema'))")
        conn.execute(_SCHEMA)


def handle(task):
    account = task.payload.get("account")
    amount = task.payload.get("amount_cents")
    if not isinstance(account, str) or not isinstance(amount, int) or amount <= 0:
        # Retrying cannot fix a malformed payload.
        raise PermanentError("payload needs a string 'account' and a positive int 'amount_cents'")
    with task.connection() as conn:
        _ensure_schema(conn)
        with conn.transaction():
            inserted = conn.execute(
                "INSERT INTO example_charges (operation_id, account, amount_cents) "
                "VALUES (%s, %s, %s) ON CONFLICT (operation_id) DO NOTHING RETURNING 1",
                (task.idempotency_key, account, amount),
            ).fetchone()
            if inserted:
                conn.execute(
                    "INSERT INTO example_accounts (account, balance_cents) VALUES (%s, %s) "
                    "ON CONFLICT (account) DO UPDATE "
                    "SET balance_cents = example_accounts.balance_cents + EXCLUDED.balance_cents",
                    (account, amount),
                )
