"""``pgtaskd web`` as a process: what it refuses at start, how it answers bad input, who may
act, and that idle or hostile clients cannot hold it."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO_DIR, wait_until
from supervisor import Client
from web_console import PASSWORD, WebConsole, password_hash

pytest_plugins = ["daemon"]


@pytest.fixture
def console(tmp_path, db_dsn):
    web = WebConsole(tmp_path / "web", db_dsn, web={
        "actions": True, "auth": {"users": {"ops": password_hash()}},
        "max_connections": 8, "request_timeout": 1.0})
    try:
        yield web.start()
    finally:
        web.stop()


def test_a_bind_beyond_loopback_without_auth_is_refused_in_one_line(tmp_path, db_dsn):
    config = tmp_path / "pgtaskd.yaml"
    config.write_text(yaml.safe_dump({"database": {"dsn": db_dsn},
                                      "web": {"listen": "0.0.0.0:18999"}}))
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "web", "-c", str(config)],
                            capture_output=True, text=True, timeout=30, cwd=REPO_DIR)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: web.listen: 0.0.0.0:18999 is not a loopback")


@pytest.mark.parametrize("path, fragment", [
    ("/tasks?status=DONE", "unknown status"),
    ("/tasks?status=FAILED&after=garbage", "after: not a page key"),
    ("/tasks?sort=id", "sort: not a filter of this list"),
    ("/tasks?error=" + "x" * 300, "error: longer than 200"),
])
def test_a_bad_filter_is_a_400_with_its_reason(console, path, fragment):
    status, _, page = console.request("GET", path)
    assert status == 400 and fragment in page


def test_actions_need_a_login_and_the_sessions_token(console, conn):
    conn.execute("INSERT INTO tasks (id, name, task_type, status, finished_at) "
                 "VALUES ('t1', 'n', 'x', 'FAILED', now())")
    cookie, token = console.session()
    status, headers, _ = console.request(
        "POST", "/login", body={"csrf": token, "user": "ops", "password": PASSWORD},
        headers={"Cookie": cookie})
    assert status == 303
    logged_in = headers["set-cookie"].split(";")[0]
    _, _, page = console.request("GET", "/tasks/t1", headers={"Cookie": logged_in})
    new_token = page.split('name="csrf-token" content="')[1].split('"')[0]
    for body in ({"task_id": "t1"}, {"task_id": "t1", "csrf": token},
                 {"task_id": "t1", "csrf": "forged"}):
        status, _, page = console.request("POST", "/actions/retry", body=body,
                                          headers={"Cookie": logged_in})
        assert status == 403 and "token" in page
    assert conn.execute("SELECT status FROM tasks WHERE id = 't1'").fetchone()[0] == "FAILED"
    status, _, _ = console.request("POST", "/actions/retry",
                                   body={"task_id": "t1", "csrf": new_token},
                                   headers={"Cookie": logged_in})
    assert status == 303
    assert conn.execute("SELECT status FROM tasks WHERE id = 't1'").fetchone()[0] == "PENDING"
    # A second retry of a PENDING task: the client's refusal, as a 409 with its words.
    status, _, page = console.request("POST", "/actions/retry",
                                      body={"task_id": "t1", "csrf": new_token},
                                      headers={"Cookie": logged_in})
    assert status == 409 and "it is PENDING" in page
    events = [(e["event"], e.get("user"), e.get("outcome")) for e in console.log()
              if e["event"] in ("web_login", "web_action")]
    assert events == [("web_login", "ops", "ok"), ("web_action", "ops", "done"),
                      ("web_action", "ops", "refused")]


def test_a_wrong_password_logs_in_no_one(console):
    cookie, token = console.session()
    status, headers, page = console.request(
        "POST", "/login", body={"csrf": token, "user": "ops", "password": "nope"},
        headers={"Cookie": cookie})
    assert status == 401 and "Wrong user or password" in page
    assert "set-cookie" not in headers


def test_idle_and_trickling_clients_are_cut_and_cannot_crowd_out_a_request(console):
    idle = [socket.create_connection(("127.0.0.1", console.port)) for _ in range(20)]
    trickler = socket.create_connection(("127.0.0.1", console.port))
    trickler.sendall(b"GET / HTTP/1.1\r\n")
    try:
        time.sleep(1.1)  # past EVICT_AFTER: the idle ones may now lose their place
        started = time.monotonic()
        status, _, _ = console.request("GET", "/login", timeout=5)
        assert status == 200 and time.monotonic() - started < 2

        def cut(sock: socket.socket) -> bool:
            sock.settimeout(0.05)
            try:
                return sock.recv(1) == b""
            except socket.timeout:
                return False
            except ConnectionResetError:
                return True

        def trickle_is_cut() -> bool:
            try:
                trickler.sendall(b"X")
            except OSError:
                return True
            return cut(trickler)

        # Each has request_timeout (1 s) for its whole head, however it trickles.
        wait_until(lambda: all(cut(sock) for sock in idle), timeout=5,
                   message="the idle connections closed")
        wait_until(trickle_is_cut, timeout=5, interval=0.2, message="the trickler cut")
    finally:
        for sock in [*idle, trickler]:
            sock.close()


def test_a_form_past_its_bound_is_refused(console):
    cookie, token = console.session()
    status, _, _ = console.request("POST", "/login",
                                   body={"csrf": token, "user": "x" * 20000},
                                   headers={"Cookie": cookie})
    assert status == 413


def test_a_daemon_rolls_up_the_minutes_the_console_charts(start_daemon, conn):
    conn.execute("INSERT INTO tasks (id, name, task_type, status, finished_at) VALUES "
                 "('done', 'n', 'echo', 'COMPLETED', "
                 " date_trunc('minute', now()) - interval '2 minutes')")
    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                 "VALUES ('waits', 'n', 'nobody_runs_this', now() - interval '1 minute')")
    daemon = start_daemon()
    # Its first pass, at start: the ten minutes before it, the last one with the queue seen.
    wait_until(lambda: conn.execute("SELECT count(*) FROM pgtaskd_minute_rollup "
                                    "WHERE task_type = ''").fetchone()[0] == 10,
               timeout=10, message="the rollup's first pass")
    rows = conn.execute("SELECT task_type, completed, due FROM pgtaskd_minute_rollup "
                        "WHERE task_type <> '' ORDER BY minute, task_type").fetchall()
    assert ("echo", 1, None) in rows and ("nobody_runs_this", 0, 1) in rows
    daemon.refresh()
    assert not [e for e in daemon.events if e["event"].startswith("rollup_")]


def test_the_daemons_page_lists_each_daemon_and_what_its_children_run(start_daemon, conn,
                                                                       tmp_path, db_dsn):
    import socket as sockets

    daemon = start_daemon(pools={"default": {"processes": 1}}, registry={"interval": 1})
    conn.execute("INSERT INTO tasks (id, name, task_type, payload) "
                 "VALUES ('long-one', 'n', 'sleep', '{\"seconds\": 30}')")
    web = WebConsole(tmp_path / "web-ro", db_dsn, web={})
    web.start()
    try:
        def page():
            status, _, text = web.request("GET", "/daemons")
            assert status == 200
            return text if "long-one" in text else None
        text = wait_until(page, timeout=15, message="the running task on the daemons page")
        assert sockets.gethostname() in text and ">running<" in text.replace("</td>", "<")
        assert str(daemon.process.pid) in text
    finally:
        web.stop()


def test_a_tasks_page_shows_each_failed_attempt_with_its_traceback(start_daemon, console,
                                                                    conn, db_dsn):
    start_daemon(pools={"default": {"processes": 1, "batch_size": 4}})
    with Client(db_dsn) as client:
        client.submit_many([{"task_type": "fail", "task_id": "t1", "max_retries": 1,
                             "payload": {"message": "no route to <host>"}},
                            {"task_type": "echo", "task_id": "t2"}])
    wait_until(lambda: conn.execute("SELECT status FROM tasks WHERE id = 't1'").fetchone()[0]
               == "FAILED", timeout=20, message="both runs of t1 to fail")
    status, _, page = console.request("GET", "/tasks/t1")
    assert status == 200
    attempts = page[page.index('id="task-attempts"'):]
    assert "<strong>Run 1</strong>: <span class=\"outcome\">exception" in attempts
    assert "<strong>Run 2</strong>: <span class=\"outcome\">exception" in attempts
    assert attempts.count('<pre class="traceback">Traceback (most recent call last):') == 2
    assert attempts.count("RuntimeError: no route to &lt;host&gt;") == 4  # message, traceback
    assert "<host>" not in page


def failed_tasks(conn) -> None:
    conn.execute("""INSERT INTO tasks (id, name, task_type, status, finished_at, error_message)
                    VALUES ('a1', 'n', 'a', 'FAILED', now(), 'TimeoutError: read timed out'),
                           ('a2', 'n', 'a', 'FAILED', now(), 'timeout after 30 s'),
                           ('a3', 'n', 'a', 'FAILED', now(), 'ValueError: bad row'),
                           ('a4', 'n', 'a', 'CANCELLED', now(), 'timeout'),
                           ('b1', 'n', 'b', 'FAILED', now(), 'timeout')""")


def statuses(conn) -> dict[str, str]:
    return dict(conn.execute("SELECT id, status FROM tasks").fetchall())


def test_bulk_retry_counts_first_then_retries_exactly_what_the_list_shows(console, conn):
    failed_tasks(conn)
    before = statuses(conn)
    cookie, token = console.log_in()
    filters = {"status": "FAILED", "type": "a", "error": "TIMEOUT"}
    _, _, page = console.request("GET", "/tasks?status=FAILED&type=a&error=TIMEOUT",
                                 headers={"Cookie": cookie})
    assert 'action="/actions/bulk-retry" id="bulk"' in page
    status, _, page = console.request("POST", "/actions/bulk-retry",
                                      body={"csrf": token, **filters},
                                      headers={"Cookie": cookie})
    assert status == 200 and "<strong>2</strong> tasks would be retried" in page
    assert '<input type="hidden" name="confirm" value="yes">' in page
    assert statuses(conn) == before
    status, _, page = console.request("POST", "/actions/bulk-retry",
                                      body={"csrf": token, **filters, "confirm": "yes"},
                                      headers={"Cookie": cookie})
    assert status == 200 and "Retried: 2." in page
    assert statuses(conn) == {**before, "a1": "PENDING", "a2": "PENDING"}
    logged = [e for e in console.log() if e["event"] == "web_action"]
    assert logged == [{**logged[0], "user": "ops", "action": "bulk-retry", "outcome": "done",
                       "filter": filters, "changed": 2, "refused": 0, "skipped": 0,
                       "reached_max": False}]
    # The PENDING list offers to cancel them: its dry run counts the two, and changes nothing.
    _, _, page = console.request("GET", "/tasks?status=PENDING&type=a",
                                 headers={"Cookie": cookie})
    assert 'action="/actions/bulk-cancel" id="bulk"' in page
    status, _, page = console.request("POST", "/actions/bulk-cancel",
                                      body={"csrf": token, "status": "PENDING", "type": "a"},
                                      headers={"Cookie": cookie})
    assert status == 200 and "<strong>2</strong> tasks would be cancelled" in page
    assert statuses(conn)["a1"] == "PENDING"


def test_a_bulk_action_on_a_bad_filter_is_a_400(console, conn):
    failed_tasks(conn)
    before = statuses(conn)
    cookie, token = console.log_in()
    for form, fragment in (
            ({"status": "RUNNING"}, "statuses: retry takes FAILED or CANCELLED tasks, not "
                                    "RUNNING"),
            ({"status": "FAILED", "sort": "id"}, "sort: not a filter of this list"),
            ({"status": "FAILED", "type": "x" * 300}, "type: longer than 200")):
        status, _, page = console.request("POST", "/actions/bulk-retry",
                                          body={"csrf": token, "confirm": "yes", **form},
                                          headers={"Cookie": cookie})
        assert status == 400 and fragment in page, (form, page)
    assert statuses(conn) == before


def test_without_a_login_or_actions_there_is_no_bulk_form_and_its_post_is_a_403(
        console, conn, tmp_path, db_dsn):
    failed_tasks(conn)
    before = statuses(conn)
    showing = WebConsole(tmp_path / "web-showing", db_dsn,
                         web={"auth": {"users": {"ops": password_hash()}}})
    showing.start()
    try:
        for web, (cookie, token), refusal in (
                (console, console.session(), "log in to act"),
                (showing, showing.log_in(), "actions are off")):
            _, _, page = web.request("GET", "/tasks?status=FAILED", headers={"Cookie": cookie})
            assert ">a1<" in page and "bulk" not in page
            for action in ("bulk-retry", "bulk-purge"):
                status, _, page = web.request(
                    "POST", f"/actions/{action}",
                    body={"csrf": token, "status": "FAILED", "confirm": "yes"},
                    headers={"Cookie": cookie})
                assert status == 403 and refusal in page
    finally:
        showing.stop()
    # Logged in with actions on, but without the session's token.
    cookie, token = console.log_in()
    for csrf in ({}, {"csrf": "forged"}):
        status, _, page = console.request(
            "POST", "/actions/bulk-purge", body={**csrf, "status": "FAILED", "confirm": "yes"},
            headers={"Cookie": cookie})
        assert status == 403 and "token" in page
    assert statuses(conn) == before



BENCH_PAGES = ["overview", "overview, live update", "tasks PENDING, all types",
               "tasks PENDING, one type", "tasks PENDING, one type, page 2",
               "tasks PENDING, due later", "tasks RUNNING", "tasks FAILED",
               "tasks FAILED, one type", "tasks COMPLETED, error text",
               "tasks FAILED, id prefix", "a task", "schedules", "limits", "pauses"]


def test_web_bench_prints_each_pages_p50_p95_and_max_at_its_smallest_sizes(tmp_path, db_dsn,
                                                                           conn):
    from cli_runs import pgtaskd, write_config

    config = write_config(tmp_path, db_dsn)
    result = pgtaskd("web-bench", "-c", config, "--finished", "0", "--pending", "0",
                     "--requests", "3", dsn=None)
    assert result.returncode == 0, result.stderr
    title, header, *rows = result.stdout.splitlines()
    assert title.startswith("0 finished and 0 pending tasks (200 running, 8 types; filled in ")
    assert title.endswith("), 3 requests a page")
    assert header.split() == ["page", "server", "p50", "p95", "max", "client", "p50", "(ms)"]
    printed = {}
    for row in rows:
        label, figures = re.fullmatch(r"(.+?)\s+((?:\s*\d+\.\d){4})", row).groups()
        printed[label] = [float(f) for f in figures.split()]
    assert list(printed) == BENCH_PAGES
    for label, (p50, p95, most, client_p50) in printed.items():
        assert 0 < p50 <= p95 <= most and client_p50 > 0, (label, p50, p95, most)
    # Its scratch schema is gone with it.
    assert conn.execute("SELECT count(*) FROM pg_namespace "
                        "WHERE nspname LIKE 'pgtaskd_bench_%'").fetchone() == (0,)
