"""What a row or a handler can do to a child's link to its supervisor, and what it must not
(issue 15, items 8, 15 and 16): an id too long for a packet, a handler that ignores SIGTERM,
a handler that closes the link. Real daemons, real signals, real PostgreSQL."""

from __future__ import annotations

import pytest

from conftest import task_row, wait_until

pytestmark = pytest.mark.slow

pytest_plugins = ["daemon"]


def test_ids_too_long_for_one_packet_neither_spin_nor_stall_their_batch(start_daemon, conn):
    """150 ids of 200 emoji are 360 KiB as JSON, over the link's packet in one claim; an id of
    50,000 control characters (plain SQL) is over it alone. The first are claimed in parts
    and run; the second fails once, not released and re-claimed a hundred times a second."""
    emoji = ["\U0001F600" * 197 + f"{i:03d}" for i in range(150)]
    huge = "\x01" * 50_000
    with conn.cursor() as cur:
        for task_id in emoji + [huge]:
            cur.execute("INSERT INTO tasks (id, name, task_type, payload) "
                        "VALUES (%s, 'hostile', 'echo', '{}')", (task_id,))
    d = start_daemon(pools={"default": {"processes": 1, "batch_size": 200}})
    wait_until(lambda: task_row(conn, huge)["status"] == "FAILED", timeout=20,
               message="the task whose id cannot be linked to fail")
    wait_until(lambda: all(task_row(conn, t)["status"] == "COMPLETED" for t in emoji),
               timeout=20, message="the 150 long ids to complete")
    row = task_row(conn, huge)
    assert (row["attempts"], row["retry_count"]) == (1, 0)
    assert "50000 characters" in row["error_message"]
    assert not d.find("batch_released")
