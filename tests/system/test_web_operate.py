"""The console's actions beyond a task's retry, and its Schedules, Limits and Pauses pages,
through real HTTP to a real ``pgtaskd web``: purge by filter, pause and resume, set and remove
a limit, cancel a task, each changing the database as the client's own function does and
logged with its user; each page showing what the database holds. The actions share one
database and one acting console (starting a console costs seconds), each test with task types
and ids of its own.
"""

from __future__ import annotations

import re
from datetime import datetime

import psycopg
import pytest

from conftest import scratch_database, wait_until
from supervisor import Client
from web_console import WebConsole, password_hash

pytest_plugins = ["daemon"]


@pytest.fixture(scope="module")
def dsn(pg_admin_dsn, template_db):
    with scratch_database(pg_admin_dsn, "pgtaskd_wo", template_db) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def db(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def console(dsn, tmp_path_factory):
    web = WebConsole(tmp_path_factory.mktemp("web-operate"), dsn, web={
        "actions": True, "auth": {"users": {"ops": password_hash()}}})
    try:
        yield web.start()
    finally:
        web.stop()


class Acting:
    """A logged-in user's POSTs, and the action lines logged since this was made."""

    def __init__(self, console: WebConsole):
        self.console = console
        self.cookie, self.token = console.log_in()
        self.mark = len(console.log())

    def post(self, action: str, **form) -> tuple[int, dict, str]:
        return self.console.request("POST", f"/actions/{action}",
                                    body={"csrf": self.token, **form},
                                    headers={"Cookie": self.cookie})

    def get(self, path: str) -> str:
        status, _, page = self.console.request("GET", path, headers={"Cookie": self.cookie})
        assert status == 200, page
        return page

    def logged(self) -> list[dict]:
        return [e for e in self.console.log()[self.mark:] if e["event"] == "web_action"]


def statuses(db, prefix: str) -> dict[str, str]:
    return dict(db.execute("SELECT id, status FROM tasks WHERE id LIKE %s",
                           (prefix + "%",)).fetchall())


def test_bulk_purge_counts_first_then_deletes_exactly_the_filtered_finished_tasks(console,
                                                                                  db):
    db.execute("""
        INSERT INTO tasks (id, name, task_type, status, finished_at, error_message)
        VALUES ('pg-a1', 'n', 'pg_a', 'FAILED', now(), 'TimeoutError: read timed out'),
               ('pg-a2', 'n', 'pg_a', 'FAILED', now(), 'timeout after 30 s'),
               ('pg-a3', 'n', 'pg_a', 'FAILED', now(), 'ValueError: bad row'),
               ('pg-a4', 'n', 'pg_a', 'CANCELLED', now(), 'timeout'),
               ('pg-a5', 'n', 'pg_a', 'COMPLETED', now(), NULL),
               ('pg-b1', 'n', 'pg_b', 'FAILED', now(), 'timeout')""")
    db.execute("INSERT INTO tasks (id, name, task_type) VALUES ('pg-p1', 'n', 'pg_a')")
    db.execute("INSERT INTO tasks (id, name, task_type, status, started_at, claimed_by, "
               "lease_until, lease_token) VALUES ('pg-r1', 'n', 'pg_a', 'RUNNING', now(), "
               "'w', now() + interval '1 hour', 1)")
    before = statuses(db, "pg-")
    acting = Acting(console)
    # Offered on the lists of finished tasks only.
    for status, offered in (("FAILED", True), ("CANCELLED", True), ("COMPLETED", True),
                            ("PENDING", False), ("RUNNING", False)):
        page = acting.get(f"/tasks?status={status}&type=pg_a")
        assert ('action="/actions/bulk-purge" id="bulk-purge"' in page) is offered, status
    filters = {"status": "FAILED", "type": "pg_a", "error": "TIMEOUT"}
    status, _, page = acting.post("bulk-purge", **filters)
    assert status == 200 and "<strong>2</strong> tasks would be deleted" in page, page
    assert '<input type="hidden" name="confirm" value="yes">' in page
    assert statuses(db, "pg-") == before
    status, _, page = acting.post("bulk-purge", **filters, confirm="yes")
    assert status == 200 and "Deleted: 2." in page, page
    left = {k: v for k, v in before.items() if k not in ("pg-a1", "pg-a2")}
    assert statuses(db, "pg-") == left
    # A filter naming a live status is refused with its reason, and deletes nothing.
    for live in ("PENDING", "RUNNING"):
        status, _, page = acting.post("bulk-purge", status=live, type="pg_a", confirm="yes")
        assert status == 400, page
        assert (f"statuses: purge takes COMPLETED, FAILED or CANCELLED tasks, not {live}"
                in page)
    assert statuses(db, "pg-") == left
    assert [(e["action"], e["user"], e["outcome"], e["filter"], e.get("changed"))
            for e in acting.logged()] == [
        ("bulk-purge", "ops", "done", filters, 2),
        ("bulk-purge", "ops", "refused", {"status": "PENDING", "type": "pg_a"}, None),
        ("bulk-purge", "ops", "refused", {"status": "RUNNING", "type": "pg_a"}, None)]


def test_pause_resume_limits_and_cancel_change_the_database_as_the_client_does(console, db,
                                                                               dsn):
    db.execute("INSERT INTO tasks (id, name, task_type) VALUES ('op-1', 'n', 'op_a')")
    acting = Acting(console)
    with Client(dsn) as client:
        status, headers, _ = acting.post("pause", task_type="op_a")
        assert (status, headers["location"]) == (303, "/pauses?notice=paused")
        assert db.execute("SELECT paused_by FROM task_type_pauses WHERE task_type = 'op_a'"
                          ).fetchone() == ("ops (web)",)
        assert [(p["task_type"], p["paused_by"], p["due_pending"])
                for p in client.paused()] == [("op_a", "ops (web)", 1)]
        # Paused already: the client keeps the first pause, and so does the console.
        assert acting.post("pause", task_type="op_a")[0] == 303
        status, _, _ = acting.post("resume", task_type="op_a")
        assert status == 303 and client.paused() == []

        status, headers, _ = acting.post("set-limit", task_type="op_a", max_running="3")
        assert (status, headers["location"]) == (303, "/limits?notice=limit-set")
        assert [(limit["task_type"], limit["max_running"], limit["updated_by"],
                 limit["running"])
                for limit in client.limits()] == [("op_a", 3, "ops (web)", 0)]
        assert db.execute("SELECT count(*) FROM task_type_slots WHERE task_type = 'op_a'"
                          ).fetchone() == (3,)
        for bad in ("three", "-1", "0"):
            status, _, page = acting.post("set-limit", task_type="op_a", max_running=bad)
            assert status == 400 and "max_running: " in page, (bad, page)
        assert [limit["max_running"] for limit in client.limits()] == [3]
        status, _, _ = acting.post("remove-limit", task_type="op_a")
        assert status == 303 and client.limits() == []

        status, headers, _ = acting.post("cancel", task_id="op-1")
        assert (status, headers["location"]) == (303, "/tasks/op-1?notice=cancelled")
        assert client.get("op-1")["status"] == "CANCELLED"
        # Cancelling it again: the client's refusal, with its words.
        status, _, page = acting.post("cancel", task_id="op-1")
        assert status == 409 and "CANCELLED" in page
    assert [(e["action"], e["user"], e["outcome"], e.get("task_type", e.get("task_id")))
            for e in acting.logged()] == [
        ("pause", "ops", "done", "op_a"), ("pause", "ops", "done", "op_a"),
        ("resume", "ops", "done", "op_a"), ("set-limit", "ops", "done", "op_a"),
        ("set-limit", "ops", "refused", "op_a"), ("set-limit", "ops", "refused", "op_a"),
        ("set-limit", "ops", "refused", "op_a"), ("remove-limit", "ops", "done", "op_a"),
        ("cancel", "ops", "done", "op-1"), ("cancel", "ops", "refused", "op-1")]


SCHEDULES = {"yearly": {"cron": "0 0 1 1 *", "task_type": "echo"},
             "beat": {"cron": "*/2 * * * * *", "task_type": "echo"}}


def row_of(page: str, opening: str) -> list[str]:
    """The cells' texts of the table row that starts with ``opening``."""
    row = page[page.index(opening):]
    row = row[:row.index("</tr>")]
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(
        r"<td[^>]*>(.*?)</td>", row, re.DOTALL)]


def test_the_schedules_limits_and_pauses_pages_show_the_databases_state(start_daemon, conn,
                                                                        tmp_path, db_dsn):
    web = WebConsole(tmp_path / "web-pages", db_dsn, schedules=SCHEDULES)
    web.start()
    try:
        def page(path: str) -> str:
            status, _, text = web.request("GET", path)
            assert status == 200, (path, text)
            return text

        # An empty database: every page answers, and says there is nothing.
        for path in ("/", "/tasks", "/tasks?status=COMPLETED", "/daemons"):
            page(path)
        assert "No limits." in page("/limits")
        assert "Nothing is paused." in page("/pauses")
        year = conn.execute("SELECT extract(year FROM now() AT TIME ZONE 'UTC')::int"
                            ).fetchone()[0]
        yearly = row_of(page("/schedules"), '<tr id="schedule-yearly">')
        assert yearly == ["yearly", "0 0 1 1 *", "UTC", "echo", f"{year + 1}-01-01 00:00:00",
                          "-", "-"]

        with Client(db_dsn) as client:
            client.set_limit("sleep", 2, set_by="test")
            client.pause("fail", paused_by="test")
            client.submit_many([{"task_type": "sleep", "task_id": f"s{i}",
                                 "payload": {"seconds": 30}} for i in range(3)]
                               + [{"task_type": "fail", "task_id": "f1"}])
            start_daemon(pools={"default": {"processes": 3}}, schedules=SCHEDULES)

            # The limit with its slots in use: two of the three sleeps run, the third waits.
            def limit_full():
                cells = row_of(page("/limits"), "<tr><td>sleep</td>")
                return cells if cells[2] == "2" else None
            cells = wait_until(limit_full, timeout=15, message="two sleeps in the limit's slots")
            assert cells[:3] == ["sleep", "2", "2"] and cells[4] == "test"
            assert [(limit["max_running"], limit["running"])
                    for limit in client.limits()] == [(2, 2)]
            assert conn.execute("SELECT count(*) FROM tasks WHERE task_type = 'sleep' "
                                "AND status = 'RUNNING'").fetchone() == (2,)

            # The paused type, with its due task waiting.
            paused = client.paused()[0]
            assert row_of(page("/pauses"), "<tr><td>fail</td>") == [
                "fail", paused["paused_at"].strftime("%Y-%m-%d %H:%M:%S"), "test", "1"]

            # A schedule the daemon ran: its last run, that run's task and status, the next.
            def ran():
                cells = row_of(page("/schedules"), '<tr id="schedule-beat">')
                return cells if cells[6] == "COMPLETED" else None
            beat = wait_until(ran, timeout=15, message="a run of the beat schedule completed")
            following, last = (datetime.strptime(t, "%Y-%m-%d %H:%M:%S") for t in beat[4:6])
            assert beat[:4] == ["beat", "*/2 * * * * *", "UTC", "echo"]
            assert following > last and last.second % 2 == 0 and following.second % 2 == 0
            link = re.search(r'<tr id="schedule-beat">.*?href="/tasks/([^"]+)"',
                             page("/schedules"), re.DOTALL)[1]
            assert link.startswith("schedule%3Abeat%3A")
    finally:
        web.stop()
