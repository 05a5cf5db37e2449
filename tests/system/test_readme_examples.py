"""The README's console examples, run for real and compared with what the README shows, so
that a change of output fails here until the README follows.

The convention (README.md, under Tests, says the same):

- Every ```console block of README.md is a case, and they run in the README's order, one
  after the other, against one scratch database, as the README tells one story.
- A line that starts with ``$ `` is a command; the lines after it, up to the next command or
  the fence, are what it prints: stdout and stderr as a terminal shows them (both to one
  pipe, the interpreter unbuffered). Each command runs in bash, as a real process, in a
  scratch folder that holds the repository's ``etc/`` and ``handlers/``, with ``pgtaskd``
  of this interpreter's environment first on PATH and ``PGTASKD_DSN`` naming the scratch
  database; ``export NAME=VALUE`` sets NAME for the commands after it (an export of
  ``PGTASKD_DSN`` keeps the scratch database).
- An HTML comment on the line just above the fence steers its block:
  ``<!-- readme-test: skip: REASON -->`` runs nothing and reports the block skipped with
  REASON; ``<!-- readme-test: setup NAME -->`` first runs NAME, a function of SETUPS below.
  Blocks in sections this test does not own are skipped by SKIPPED_ELSEWHERE below, with
  their reasons (a key that no longer matches a block fails).
- Before comparing, MASKS replace what differs from run to run, in the README and in the
  output alike: ids, times, durations, pids, host and user names, versions, paths of the
  checkout, and each task's measured CPU, memory and lease token.
- A line of the README that is only "..." stands for any lines of the output (none
  included), where the README cuts a long output short.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
import yaml

from conftest import REPO_DIR, scratch_database, wait_until

README = REPO_DIR / "README.md"
MARKER = re.compile(r"<!-- readme-test: (skip: (?P<reason>.+?)|setup (?P<setup>\w+)) -->")
EXPORT = re.compile(r"export (?P<name>[A-Z_]+)=(?P<value>\S+)$")

# Blocks of sections other work owns, skipped here rather than marked there: each key is the
# block's first line.
SKIPPED_ELSEWHERE = {
    "$ pgtaskd worker -c chatty.yaml     # in a terminal; a chatty task submitted meanwhile":
        "a worker in a terminal, running until stopped; tests/system/test_logs.py checks "
        "the text format on a pseudo-terminal",
    "$ pgtaskd daemons":
        "the registry of daemons on two hosts; tests/system/test_registry.py checks "
        "pgtaskd daemons on a real daemon",
    "$ pgtaskd bench --tasks 5000 --processes 2 --runs 3":
        "a benchmark of minutes whose figures vary; tests/system/test_bench.py runs a small one",
    "$ pgtaskd web-bench --finished 5000000 --pending 1000000 --requests 100":
        "a benchmark that fills millions of rows, and whose figures vary",
}

# Each pattern and what it becomes, applied in this order to the README and the output.
MASKS = [
    # Absolute paths of a checkout (the README's, this one's): from the root to etc/ or
    # handlers/.
    (re.compile(r"(?<![\w.])/[^\s'\"]*?/(?=(etc|handlers)/)"), "<repo>/"),
    # Measurements of one run: a task's CPU seconds, peak memory and lease token.
    (re.compile(r"((?:cpu_seconds|peak_rss_bytes|lease_token)\"?:?\s+)[\d.e+-]+"), r"\1<n>"),
    # A worker id: host, pid, pool and slot.
    (re.compile(r"\b[\w.-]+:\d+:(\w+#\d+)"), r"<host>:<pid>:\1"),
    (re.compile(r"\"pid\": ?\d+"), '"pid": <pid>'),
    (re.compile(r"\bby [\w.-]+@[\w.-]+"), "by <user>@<host>"),
    (re.compile(r"\bpgtaskd \d+\.\d+\S*"), "pgtaskd <version>"),
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:\d\d)"), "<time>"),
    (re.compile(r"\b\d+\.\d+ s\b"), "<seconds> s"),
    (re.compile(r"(\"oldest_pending_age\": )[\d.e+-]+"), r"\1<seconds>"),
]
UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def matches(printed: list[str], expected: list[str]) -> bool:
    """Whether the lines are the same, a line of the README that is only "..." standing
    for any lines of the output (none included), as the README elides a long output."""
    @functools.cache
    def from_here(p: int, e: int) -> bool:
        if e == len(expected):
            return p == len(printed)
        if expected[e] == "...":
            return any(from_here(rest, e + 1) for rest in range(p, len(printed) + 1))
        return p < len(printed) and printed[p] == expected[e] and from_here(p + 1, e + 1)
    return from_here(0, 0)


def masked(text: str) -> list[str]:
    """The lines of ``text`` with MASKS applied, each UUID numbered by its first appearance
    (so that the same id twice is still seen to be the same), trailing blanks dropped."""
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    numbers: dict[str, int] = {}
    text = UUID.sub(lambda m: f"<id{numbers.setdefault(m.group(), len(numbers) + 1)}>", text)
    return [line.rstrip() for line in text.splitlines()]


@dataclass
class Block:
    line: int                                  # of the fence, 1-based
    heading: str
    lines: list[str]
    marker: dict = field(default_factory=dict)
    yaml_above: str = ""                       # the last ```yaml block before this one

    @property
    def name(self) -> str:
        return f"line {self.line} ({self.heading})"

    def commands(self) -> list[tuple[str, str]]:
        """(command, expected output) pairs."""
        pairs = []
        for text in self.lines:
            if text.startswith("$ "):
                pairs.append((text[2:], []))
            elif pairs:
                pairs[-1][1].append(text)
        return [(command, "\n".join(output)) for command, output in pairs]

    def skip_reason(self) -> str | None:
        first = self.lines[0] if self.lines else ""
        if self.marker.get("reason"):
            return self.marker["reason"]
        return SKIPPED_ELSEWHERE.get(first)


def readme_blocks() -> list[Block]:
    blocks, heading, marker, yaml_above = [], "", {}, ""
    fence, language = None, None        # the block being read, and its fence's language
    for number, text in enumerate(README.read_text("utf-8").splitlines(), 1):
        if language is not None:
            if text.startswith("```"):
                if language == "console":
                    blocks.append(fence)
                elif language == "yaml":
                    yaml_above = "\n".join(fence.lines)
                language = None
            else:
                fence.lines.append(text)
            continue
        if text.startswith("```"):
            language = text[3:].strip()
            fence = Block(number, heading, [], marker, yaml_above)
        elif text.startswith("#"):
            heading = text.lstrip("# ")
        found = MARKER.fullmatch(text.strip())
        marker = found.groupdict() if found else {}
    return blocks


BLOCKS = readme_blocks()


# --- setups: what a block needs that the README does not show ---------------------------------


@dataclass
class Story:
    """What the commands share: the database, the folder they run in, their environment."""
    dsn: str
    folder: Path
    env: dict


@contextlib.contextmanager
def worker(story: Story, *arguments: str):
    """`pgtaskd worker` running, stopped by SIGTERM at the end of the block."""
    process = subprocess.Popen(["pgtaskd", "worker", *arguments], cwd=story.folder,
                               env=story.env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def run_due_tasks(story: Story, block: Block) -> None:
    """`pgtaskd worker` with the example config, until no due task of its pool is left."""
    with worker(story), psycopg.connect(story.dsn, autocommit=True) as conn:
        wait_until(lambda: conn.execute(
            "SELECT count(*) = 0 FROM tasks WHERE task_type IN ('echo', 'charge', 'flaky') "
            "AND (status = 'RUNNING' OR status = 'PENDING' AND scheduled_time <= now())"
        ).fetchone()[0], timeout=30, message="the worker to run the due tasks")


def flaky_retried_twice(story: Story, block: Block) -> None:
    """flaky-3, failing its first two runs, run by `pgtaskd worker` until it completed, with
    the example config's retry delays cut to 0.1 s."""
    config = yaml.safe_load((story.folder / "etc" / "pgtaskd.yaml").read_text())
    config["retry"] = {"base_delay": 0.1, "max_delay": 0.1, "jitter": 0}
    (story.folder / "etc" / "fast-retries.yaml").write_text(yaml.safe_dump(config))
    submitted = subprocess.run(["pgtaskd", "submit", "flaky", "--id", "flaky-3", "--payload",
                                '{"fail_times": 2}'], cwd=story.folder, env=story.env,
                               capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    with worker(story, "-c", "etc/fast-retries.yaml"), \
            psycopg.connect(story.dsn, autocommit=True) as conn:
        wait_until(lambda: conn.execute("SELECT status = 'COMPLETED' FROM tasks "
                                        "WHERE id = 'flaky-3'").fetchone()[0],
                   timeout=30, message="flaky-3 to complete on its third run")


def failed_in_bulk(story: Story, block: Block) -> None:
    """Only 1,200 `flaky` tasks that failed permanently within the hour (unique keys
    flaky-key-0 to -1199) and 40 `charge` tasks that failed on a bad payload."""
    with psycopg.connect(story.dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE tasks CASCADE")
        conn.execute(
            "INSERT INTO tasks (id, name, task_type, status, payload, error_message, unique_key,"
            "                   created_at, finished_at) "
            "SELECT 'flaky-' || n, 'flaky', 'flaky', 'FAILED', '{\"permanent\": true}', "
            "       'PermanentError: asked to fail permanently', 'flaky-key-' || n, "
            "       now() - interval '5 minutes', now() - interval '4 minutes' "
            "FROM generate_series(0, 1199) AS n")
        conn.execute(
            "INSERT INTO tasks (id, name, task_type, status, payload, error_message, "
            "                   created_at, finished_at) "
            "SELECT 'charge-' || n, 'charge', 'charge', 'FAILED', '{\"cents\": 500}', "
            "       'PermanentError: payload needs a string ''account'' and a positive int "
            "''amount_cents''', now() - interval '5 minutes', now() - interval '4 minutes' "
            "FROM generate_series(0, 39) AS n")


def big_payload_file(story: Story, block: Block) -> None:
    """big.json: a payload one byte over the default max_payload_bytes."""
    (story.folder / "big.json").write_text('{"x": "' + "x" * (1024 * 1024 - 8) + '"}')


def schedule_above_in_config(story: Story, block: Block) -> None:
    """The example config with the README's schedule above added, as PGTASKD_CONFIG."""
    config = yaml.safe_load((story.folder / "etc" / "pgtaskd.yaml").read_text())
    config.update(yaml.safe_load(block.yaml_above))
    (story.folder / "etc" / "scheduled.yaml").write_text(yaml.safe_dump(config))
    story.env["PGTASKD_CONFIG"] = "etc/scheduled.yaml"


SETUPS = {setup.__name__: setup for setup in
          (run_due_tasks, flaky_retried_twice, failed_in_bulk, big_payload_file, schedule_above_in_config)}


# --- running the story -------------------------------------------------------------------------


def run_command(story: Story, command: str) -> str:
    result = subprocess.run(["bash", "-c", command], cwd=story.folder, env=story.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=60)
    return result.stdout.rstrip("\n")


@pytest.fixture(scope="module")
def story_outputs(pg_admin_dsn, tmp_path_factory):
    """Every block that runs, run in order: block line -> (expected, printed) text."""
    console = shutil.which("pgtaskd", path=str(Path(sys.executable).parent))
    assert console, f"no pgtaskd console script beside {sys.executable}: pip install -e ."
    folder = tmp_path_factory.mktemp("readme")
    for name in ("etc", "handlers"):
        shutil.copytree(REPO_DIR / name, folder / name)
    outputs = {}
    with scratch_database(pg_admin_dsn, "pgtaskd_readme") as dsn:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGTASKD_")}
        env.update(PATH=f"{Path(console).parent}{os.pathsep}{env.get('PATH', '')}",
                   PYTHONUNBUFFERED="1", PGTASKD_DSN=dsn)
        for block in BLOCKS:
            if block.skip_reason():
                continue
            story = Story(dsn, folder, dict(env))  # a setup's changes last for its block
            if block.marker.get("setup") in SETUPS:
                SETUPS[block.marker["setup"]](story, block)
            expected, printed = [], []
            for command, output in block.commands():
                expected += [f"$ {command}", output]
                exported = EXPORT.fullmatch(command)
                if exported and exported["name"] != "PGTASKD_DSN":
                    env[exported["name"]] = story.env[exported["name"]] = exported["value"]
                printed += [f"$ {command}", "" if exported else run_command(story, command)]
            outputs[block.line] = ("\n".join(expected), "\n".join(printed))
    return outputs


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: f"line{block.line}")
def test_readme_console_block_prints_what_the_readme_shows(block, story_outputs):
    if block.skip_reason():
        pytest.skip(block.skip_reason())
    assert block.marker.get("setup") in (None, *SETUPS), f"{block.name}: unknown setup"
    assert block.commands(), (f"{block.name}: a console block with no '$ ' command: mark it "
                              "<!-- readme-test: skip: REASON -->")
    expected, printed = story_outputs[block.line]
    if not matches(masked(printed), masked(expected)):
        assert masked(printed) == masked(expected), f"{block.name} prints otherwise"


def test_every_block_skipped_elsewhere_is_still_in_the_readme():
    firsts = {block.lines[0] for block in BLOCKS if block.lines}
    assert set(SKIPPED_ELSEWHERE) <= firsts, set(SKIPPED_ELSEWHERE) - firsts
