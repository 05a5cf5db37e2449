"""The web console in a real browser: headless Chromium from the Debian packages (chromium,
chromium-driver), driven by selenium, against real ``pgtaskd web`` processes on a real
PostgreSQL. One browser and one database for the module (it must stay under a minute);
each test makes tasks of its own types.

With PGTASKD_SCREENSHOTS set to a folder (docs/screenshots for the README), the run also
saves what the pages look like there, light and dark, wide and narrow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from conftest import REPO_DIR, scratch_database, wait_until
from web_console import PASSWORD, WebConsole, password_hash

from supervisor.maintenance.rollup import MinuteRollup

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.common.exceptions import NoSuchElementException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
except ImportError:  # the test extra brings it
    webdriver = None

pytestmark = pytest.mark.skipif(
    webdriver is None or CHROMIUM is None or DRIVER is None,
    reason="needs selenium and headless Chromium (apt-get install chromium chromium-driver)")

SHOTS = os.environ.get("PGTASKD_SCREENSHOTS")


@pytest.fixture(scope="module")
def dsn(pg_admin_dsn, template_db):
    with scratch_database(pg_admin_dsn, "pgtaskd_web", template_db) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def db(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def consoles(dsn, tmp_path_factory):
    """Two consoles on the same database: one that lets a logged-in user act, one that
    only shows (web.actions false, no users)."""
    folder = tmp_path_factory.mktemp("web")
    acting = WebConsole(folder / "acting", dsn, web={
        "actions": True, "auth": {"users": {"ops": password_hash()}}})
    readonly = WebConsole(folder / "readonly", dsn)
    try:
        acting.start()
        readonly.start()
        yield {"acting": acting, "readonly": readonly}
    finally:
        acting.stop()
        readonly.stop()


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1100,800"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=DRIVER))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def shot(browser, name: str) -> None:
    if SHOTS:
        folder = Path(SHOTS)
        if not folder.is_absolute():
            folder = REPO_DIR / folder
        folder.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(folder / f"{name}.png"))


def text_of(browser, css: str) -> str:
    """Read in one script: the page's live part may be replaced between two calls."""
    found = browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;", css)
    if found is None:
        raise NoSuchElementException(css)
    return found


def texts_of(browser, css: str) -> list[str]:
    return browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText);", css)


def present(browser, css: str) -> bool:
    try:
        browser.find_element(By.CSS_SELECTOR, css)
        return True
    except NoSuchElementException:
        return False


def number(text: str) -> int:
    return int(text.split()[0].replace(",", ""))


def new_type(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:6]}"


def add_tasks(db, task_type: str, count: int, *, status: str = "PENDING", due: str = "now()",
              finished: str | None = None, error: str | None = None, priority: str = "0",
              prefix: str | None = None) -> list[str]:
    prefix = prefix or task_type
    rows = db.execute(
        f"""INSERT INTO tasks (id, name, task_type, status, priority, scheduled_time,
                               finished_at, error_message, claimed_by, lease_until)
            SELECT %(prefix)s || '-' || lpad(g::text, 5, '0'), 'job ' || g, %(type)s,
                   %(status)s, {priority}, {due}, {finished or 'NULL'}, %(error)s,
                   CASE WHEN %(status)s = 'RUNNING' THEN 'host:1:w' END,
                   CASE WHEN %(status)s = 'RUNNING' THEN now() + interval '1 hour' END
            FROM generate_series(1, %(count)s) AS g
            RETURNING id""",
        {"prefix": prefix, "type": task_type, "status": status, "error": error,
         "count": count}).fetchall()
    return [row[0] for row in rows]


def roll_up(dsn: str) -> None:
    """What a daemon's rollup service does once a minute, now."""
    rollup = MinuteRollup(dsn)
    try:
        rollup.run_once()
    finally:
        rollup._close()


def log_in(browser, console: WebConsole) -> None:
    browser.get(console.url + "/login")
    browser.find_element(By.NAME, "user").send_keys("ops")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.ID, "login").click()
    wait_until(lambda: "ops" in text_of(browser, "header .who"), timeout=5, message="logged in")


def test_the_overviews_numbers_equal_the_databases(browser, consoles, db, dsn):
    kind = new_type("ov")
    add_tasks(db, kind, 37, prefix=f"{kind}-due")
    add_tasks(db, kind, 12, due="now() + interval '1 hour'", prefix=f"{kind}-later")
    add_tasks(db, kind, 3, status="RUNNING", prefix=f"{kind}-run")
    # Finished within the last few complete minutes: what the rollup counts.
    minute = "date_trunc('minute', now())"
    add_tasks(db, kind, 25, status="COMPLETED", prefix=f"{kind}-done",
              finished=f"{minute} - interval '1 minute' - (g %% 120) * interval '1 second'")
    add_tasks(db, kind, 9, status="FAILED", error="ValueError: bad row", prefix=f"{kind}-bad",
              finished=f"{minute} - interval '2 minutes' - g * interval '1 second'")
    roll_up(dsn)
    browser.get(consoles["readonly"].url + "/")
    row = f'#types tr[data-type="{kind}"]'
    shown = {figure: number(text_of(browser, f'{row} td[data-figure="{figure}"]'))
             for figure in ("due", "later", "running", "failed_24h", "completed_1h")}
    truth = db.execute(
        """SELECT count(*) FILTER (WHERE status = 'PENDING' AND scheduled_time <= now()),
                  count(*) FILTER (WHERE status = 'PENDING' AND scheduled_time > now()),
                  count(*) FILTER (WHERE status = 'RUNNING'),
                  count(*) FILTER (WHERE status = 'FAILED'
                                     AND finished_at >= date_trunc('minute', now())
                                                        - interval '24 hours'),
                  count(*) FILTER (WHERE status = 'COMPLETED'
                                     AND finished_at >= date_trunc('minute', now())
                                                        - interval '1 hour')
           FROM tasks WHERE task_type = %s""", (kind,)).fetchone()
    assert shown == dict(zip(shown, truth)) == {"due": 37, "later": 12, "running": 3,
                                               "failed_24h": 9, "completed_1h": 25}
    age = text_of(browser, f'{row} td[data-figure="oldest_due_age"]')
    assert age.endswith(" s"), age
    shot(browser, "overview")


def test_filtering_the_failed_tasks_of_one_type(browser, consoles, db):
    kind, other = new_type("flt"), new_type("flt")
    failed = add_tasks(db, kind, 7, status="FAILED", error="boom", finished="now()")
    add_tasks(db, other, 5, status="FAILED", error="boom", finished="now()")
    add_tasks(db, kind, 4, prefix=f"{kind}-pending")
    browser.get(consoles["readonly"].url + "/tasks")
    form = browser.find_element(By.ID, "filters")
    Select(form.find_element(By.NAME, "status")).select_by_visible_text("FAILED")
    form.find_element(By.NAME, "type").send_keys(kind)
    form.find_element(By.CSS_SELECTOR, "button").click()
    wait_until(lambda: "status=FAILED" in browser.current_url, timeout=5, message="filtered")
    listed = texts_of(browser, "#task-list tbody td.id")
    assert sorted(listed) == sorted(failed)
    assert set(texts_of(browser, "#task-list tbody td:nth-child(3)")) == {"FAILED"}
    assert set(texts_of(browser, "#task-list tbody td:nth-child(2)")) == {kind}
    shot(browser, "tasks-failed")


def test_a_tasks_page_shows_its_error_and_each_attempts_traceback(browser, consoles, db):
    kind = new_type("err")
    error = "RuntimeError: the upstream answered 502 Bad Gateway\n(after 3 tries)"
    (task_id,) = add_tasks(db, kind, 1, status="FAILED", error=error, finished="now()")
    trace = ('Traceback (most recent call last):\n  File "/srv/app/sync.py", line 41, in '
             'handle\n    fetch(task.payload["url"])\n' + error)
    for run in (1, 2):
        db.execute("INSERT INTO task_attempts (task_id, attempt, worker_id, started_at, "
                   "outcome, error_type, message, traceback) VALUES (%s, %s, 'host:7:w1', "
                   "now(), 'exception', 'RuntimeError', %s, %s)",
                   (task_id, run, error.split(": ", 1)[1], trace))
    browser.get(f"{consoles['readonly'].url}/tasks/{task_id}")
    assert text_of(browser, "#task-error") == error
    assert text_of(browser, "#task-status") == "FAILED"
    # Oldest first, the newest traceback open; a live update keeps it as the reader left it.
    assert text_of(browser, "#traceback-2 pre").rstrip() == trace
    is_open = "return document.getElementById(arguments[0]).open"
    assert browser.execute_script(is_open, "traceback-1") is False
    browser.execute_script("document.getElementById('task-error').scrollIntoView()")
    shot(browser, "task-failed")
    browser.find_element(By.CSS_SELECTOR, "#traceback-2 summary").click()
    browser.execute_script("document.getElementById('task-columns').dataset.old = '1'")
    wait_until(lambda: browser.execute_script(
        "return !document.getElementById('task-columns').dataset.old"), timeout=5,
        message="a live update of the page")
    assert browser.execute_script(is_open, "traceback-2") is False


def test_retry_with_actions_on_makes_the_task_pending(browser, consoles, db):
    console = consoles["acting"]
    kind = new_type("retry")
    (task_id,) = add_tasks(db, kind, 1, status="FAILED", error="boom", finished="now()")
    log_in(browser, console)
    browser.get(f"{console.url}/tasks/{task_id}")
    browser.find_element(By.ID, "retry").click()
    wait_until(lambda: db.execute("SELECT status FROM tasks WHERE id = %s",
                                  (task_id,)).fetchone()[0] == "PENDING",
               timeout=5, message="the task PENDING again")
    wait_until(lambda: text_of(browser, "#task-status") == "PENDING", timeout=5,
               message="the page showing it")
    assert "Retried" in text_of(browser, ".notice")
    actions = [line for line in console.log() if line["event"] == "web_action"]
    assert actions[-1] == {**actions[-1], "user": "ops", "action": "retry",
                           "task_id": task_id, "outcome": "done"}
    browser.delete_all_cookies()


@pytest.mark.parametrize("which", ["readonly", "acting"])
def test_without_actions_or_a_login_the_button_is_absent_and_the_post_refused(
        browser, consoles, db, which):
    console = consoles[which]
    kind = new_type("ro")
    (task_id,) = add_tasks(db, kind, 1, status="FAILED", error="boom", finished="now()")
    browser.delete_all_cookies()
    browser.get(f"{console.url}/tasks/{task_id}")
    assert text_of(browser, "#task-status") == "FAILED"
    assert not present(browser, "#retry") and not present(browser, "form[action^='/actions']")
    cookie, token = console.session()
    status, _, page = console.request("POST", "/actions/retry",
                                      body={"csrf": token, "task_id": task_id},
                                      headers={"Cookie": cookie})
    assert status == 403
    assert ("actions are off" if which == "readonly" else "log in to act") in page
    assert db.execute("SELECT status FROM tasks WHERE id = %s", (task_id,)).fetchone()[0] \
        == "FAILED"


def test_a_task_submitted_from_the_cli_appears_within_2_s(browser, consoles, dsn):
    kind = new_type("cli")
    browser.get(f"{consoles['readonly'].url}/tasks?status=PENDING&type={kind}")
    assert "No PENDING task matches" in text_of(browser, "#task-list")
    task_id = f"{kind}-from-cli"
    result = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "submit", kind, "--id", task_id],
        env={**os.environ, "PGTASKD_DSN": dsn}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    submitted = time.monotonic()
    wait_until(lambda: task_id in text_of(browser, "#task-list"), timeout=2.0, interval=0.05,
               message="the task on the page without a reload")
    assert time.monotonic() - submitted <= 2.0


def test_a_list_of_1000_tasks_pages_without_duplicates_or_gaps(browser, consoles, db):
    kind = new_type("many")
    # Ties everywhere: ten priorities, one due time, one creation time for all of them.
    add_tasks(db, kind, 1000, priority="g %% 10", due="'2026-01-01 00:00Z'")
    expected = [row[0] for row in db.execute(
        "SELECT id FROM tasks WHERE task_type = %s AND status = 'PENDING' "
        "ORDER BY priority DESC, scheduled_time, created_at, id", (kind,))]
    browser.get(f"{consoles['readonly'].url}/tasks?status=PENDING&type={kind}")
    seen: list[str] = []
    pages = 0
    while True:
        pages += 1
        seen += texts_of(browser, "#task-list td.id")
        following = browser.execute_script(
            "const a = document.getElementById('next-page'); return a ? a.href : null;")
        if following is None:
            break
        browser.get(following)
    assert len(seen) == len(set(seen)) == 1000
    assert seen == expected
    assert pages == 20


def test_a_narrow_window_scrolls_no_page_sideways_and_dark_mode_follows_the_browser(
        browser, consoles, db):
    """What the screenshots show, checked without them: at a phone's width no page is wider
    than the window (its tables scroll inside their own box), and the browser's dark
    preference darkens the page."""
    console = consoles["acting"]
    kind = new_type("narrow")
    (task_id,) = add_tasks(db, kind, 1, status="FAILED", finished="now()",
                           error="ValueError: " + "a-very-long-unbroken-word" * 20)
    pages = ["/", f"/tasks?status=FAILED&type={kind}", f"/tasks/{task_id}", "/schedules",
             "/limits", "/pauses", "/daemons"]

    def widths() -> tuple[int, int]:
        return tuple(browser.execute_script(
            "return [document.documentElement.scrollWidth, window.innerWidth];"))

    def background() -> tuple[int, ...]:
        color = browser.execute_script(
            "return getComputedStyle(document.body).backgroundColor;")
        return tuple(int(part) for part in color[color.index("(") + 1:-1].split(",")[:3])

    browser.set_window_size(380, 800)
    try:
        browser.get(console.url + "/login")
        assert widths()[1] <= 380 and widths()[0] <= widths()[1], ("/login", widths())
        log_in(browser, console)  # with the action forms, which must fit too
        for path in pages:
            browser.get(console.url + path)
            scroll, inner = widths()
            assert scroll <= inner, (path, scroll, inner)
        browser.get(console.url + pages[1])
        assert present(browser, "#bulk-purge") and widths()[0] <= widths()[1]
        assert sum(background()) > 3 * 200, background()
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {
            "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        for path in pages[:3]:
            browser.get(console.url + path)
            assert sum(background()) < 3 * 60, (path, background())
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
        browser.set_window_size(1100, 800)
        browser.delete_all_cookies()


def test_screenshots_dark_and_narrow(browser, consoles):
    """Only for the README: the same pages in dark mode and in a phone-sized window."""
    if not SHOTS:
        pytest.skip("PGTASKD_SCREENSHOTS is not set")
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {
        "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    try:
        browser.get(consoles["readonly"].url + "/")
        shot(browser, "overview-dark")
        browser.set_window_size(420, 860)
        browser.get(consoles["readonly"].url + "/tasks?status=FAILED")
        shot(browser, "tasks-narrow-dark")
    finally:
        browser.set_window_size(1100, 800)
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
