"""Config files as read from disk: paths resolved against the file's folder, the environment's
overrides, and files that are hostile (aliases, sizes, bytes and values the parsers refuse)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import DSN_ENV, load_config
from supervisor.config.yaml_file import MAX_CONFIG_BYTES
from supervisor.errors import ConfigError

from test_config import parse, problem_for, problems_of


def test_relative_paths_resolve_against_the_config_files_folder(tmp_path, monkeypatch):
    folder = tmp_path / "etc" / "pgtaskd"
    folder.mkdir(parents=True)
    config_file = folder / "pgtaskd.yaml"
    config_file.write_text("handlers:\n  path: ../handlers\n  types: {echo: 'basic:echo'}\n"
                           "database:\n  data_dir: pgdata\n")
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)

    config = load_config(config_file, env={})

    assert config.handlers.path == (tmp_path / "etc" / "handlers").resolve()
    assert config.database.data_dir == (folder / "pgdata").resolve()
    assert config.path == config_file.resolve()


def test_without_a_config_file_the_embedded_database_is_the_users_wherever_the_command_runs(
        tmp_path, monkeypatch):
    """18.8: from the working directory, `cd /tmp && pgtaskd list` made a second, empty
    cluster in /tmp/var/pgdata."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        assert load_config(None, env={"HOME": "/home/ada"}).database.data_dir == \
            Path("/home/ada/.local/share/pgtaskd/pgdata")
    assert load_config(None, env={"HOME": "/home/ada", "XDG_DATA_HOME": "/data/ada"}
                       ).database.data_dir == Path("/data/ada/pgtaskd/pgdata")
    # A config file keeps its default beside it.
    config_file = tmp_path / "pgtaskd.yaml"
    config_file.write_text("poll_interval: 1\n")
    assert load_config(config_file, env={"HOME": "/home/ada"}).database.data_dir == \
        (tmp_path / "var" / "pgdata").resolve()


def test_an_absolute_path_is_kept(tmp_path):
    config = parse({"handlers": {"path": str(tmp_path / "h")}}, base_dir=Path("/elsewhere"))
    assert config.handlers.path == tmp_path / "h"


def test_the_dsn_from_the_environment_overrides_the_config(tmp_path):
    config_file = tmp_path / "pgtaskd.yaml"
    config_file.write_text("database:\n  dsn: postgresql://from-file/db\n")
    assert load_config(config_file, env={}).database.dsn == "postgresql://from-file/db"
    overridden = load_config(config_file, env={DSN_ENV: "postgresql://from-env/db"})
    assert overridden.database.dsn == "postgresql://from-env/db"


def test_the_config_file_can_come_from_the_environment(tmp_path):
    config_file = tmp_path / "pgtaskd.yaml"
    config_file.write_text("poll_interval: 2\n")
    assert load_config(None, env={"PGTASKD_CONFIG": str(config_file)}).poll_interval == 2.0


def test_problems_in_a_file_are_prefixed_with_its_name(tmp_path):
    config_file = tmp_path / "pgtaskd.yaml"
    config_file.write_text("lease:\n  seconds: soon\n")
    with pytest.raises(ConfigError) as raised:
        load_config(config_file, env={})
    assert raised.value.problems == [
        f"{config_file}: lease.seconds: must be a number of seconds, got string 'soon'"]


def test_invalid_yaml_names_the_line(tmp_path):
    config_file = tmp_path / "pgtaskd.yaml"
    config_file.write_text("lease:\n  seconds: 5\n bad: [\n")
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d+"):
        load_config(config_file, env={})


def test_a_missing_config_file_is_reported(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml", env={})


def test_a_top_level_that_is_not_a_mapping_is_rejected():
    assert "(top level)" in problems_of(["a", "list"])[0]


# -- hostile files: aliases, size, long values ---------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    config_file = tmp_path / "pgtaskd.yaml"
    config_file.write_text(text)
    return config_file


def only_problem(config_file: Path) -> str:
    with pytest.raises(ConfigError) as raised:
        load_config(config_file, env={})
    assert len(raised.value.problems) == 1, raised.value.problems
    return raised.value.problems[0]


@pytest.mark.parametrize("text", [
    "lease: &short {seconds: 5}\nhealth: *short\n",
    "defaults: &d {processes: 2}\npools:\n  a:\n    <<: *d\n",
    "a: &a [x, x]\nb: &b [*a, *a]\nhandlers: {types: {bomb: *b}}\n",
])
def test_a_yaml_alias_is_refused_naming_its_line(tmp_path, text):
    config_file = write(tmp_path, text)
    problem = only_problem(config_file)
    assert problem.startswith(f"{config_file}: invalid YAML at line ")
    assert "aliases (*name) are not allowed" in problem


def test_a_config_file_over_the_size_limit_is_refused_unread(tmp_path):
    config_file = write(tmp_path, "# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    assert only_problem(config_file) == (
        f"{config_file}: config file is larger than {MAX_CONFIG_BYTES // 1024} KiB")


def test_a_snapshot_over_the_size_limit_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="larger than"):
        load_config(tmp_path / "x.yaml", env={}, text="#" * (MAX_CONFIG_BYTES + 1))


@pytest.mark.parametrize("tree, key_path", [
    ({"handlers": {"types": {"echo": "x" * 20_000}}}, "handlers.types.echo"),
    ({"poll_interval": list(range(5_000))}, "poll_interval"),
    ({"reaper": {"batch_size": {str(i): "v" * 100 for i in range(2_000)}}}, "reaper.batch_size"),
    ({"metrics": {"listen": "h" * 20_000}}, "metrics.listen"),
    ({"pools": {"p": {"task_types": ["t" * 20_000]}}, "handlers": {"types": {}}},
     "pools.p.task_types[0]"),
    ({"database": {"listen": ["y"] * 5_000}}, "database.listen"),
])
def test_a_problem_quotes_only_a_short_prefix_of_a_huge_value(tree, key_path):
    problem = problem_for(problems_of(tree), key_path)
    assert len(problem) < 300, problem[:400]


def test_a_huge_unknown_key_is_quoted_short():
    problems = problems_of({"k" * 20_000: 1, "pools": {"p" * 20_000: {}}})
    assert len(problems) == 2 and all(len(p) < 300 for p in problems), problems


# -- bytes and values the parsers refuse ----------------------------------------------------------


def test_a_config_file_that_is_not_utf8_names_the_line(tmp_path):
    config_file = tmp_path / "pgtaskd.yaml"
    config_file.write_bytes(b"poll_interval: 1\n# caf\xe9\n")
    assert only_problem(config_file) == (
        f"{config_file}: not UTF-8 text: byte 0xe9 at line 2, column 6")


@pytest.mark.parametrize("text, reason", [
    ("poll_interval: " + "1" * 5000 + "\n", "an integer of 5000 digits"),
    ("poll_interval: 2024-13-45\n", "month must be in 1..12"),
    ("handlers: " + "[" * 20_000 + "]" * 20_000 + "\n", "nested more than"),
    ("handlers: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n", "nested more than"),
])
def test_yaml_the_constructor_refuses_is_one_problem_naming_the_line(tmp_path, text, reason):
    problem = only_problem(write(tmp_path, text))
    assert "invalid YAML at line 1, column " in problem and reason in problem, problem
    assert len(problem) < 300, problem[:400]


@pytest.mark.parametrize("tree, key_path", [
    ({"poll_interval": int("f" * 5000, 16)}, "poll_interval"),
    ({"reaper": {"batch_size": -int("f" * 5000, 16)}}, "reaper.batch_size"),
    ({"lease": {"seconds": [int("f" * 5000, 16)]}}, "lease.seconds"),
    ({"pools": {int("f" * 5000, 16): {}}}, "pools.<an integer of about 6021 digits>"),
])
def test_an_integer_too_long_to_print_is_one_short_problem(tree, key_path):
    problem = problem_for(problems_of(tree), key_path)
    assert "an integer of about 6021 digits" in problem and len(problem) < 300, problem


@pytest.mark.parametrize("dsn, fragment", [
    ("host=127.0.0.1 port=1 dbname='unterminated", "unterminated quoted string"),
    ("host=127.0.0.1 port=1 password=S3KRIT0 S3KRIT1", "not a valid connection string"),
    ("postgresql://app:S3KRIT0%zz@127.0.0.1:1/db", "invalid percent-encoded token"),
    ("host=127.0.0.1 password=S3KRIT\udcff", "a byte that is not UTF-8 at character 31"),
    ("host=127.0.0.1 password=S3KRIT\x00", "a NUL character"),
])
def test_a_dsn_libpq_cannot_read_is_a_problem_that_shows_no_password(dsn, fragment):
    from_file = problem_for(problems_of({"database": {"dsn": dsn}}), "database.dsn")
    from_env = problem_for(problems_of({}, env={DSN_ENV: dsn}), DSN_ENV)
    listen = problem_for(problems_of({"database": {"listen_dsn": dsn}}), "database.listen_dsn")
    for problem in (from_file, from_env, listen):
        assert fragment in problem and "S3KRIT" not in problem, problem


@pytest.mark.parametrize("tree, key_path", [
    ({"handlers": {"path": "handlers\x00"}}, "handlers.path"),
    ({"database": {"data_dir": "var/\x00pgdata"}}, "database.data_dir"),
])
def test_a_folder_with_a_nul_character_is_a_problem(tree, key_path):
    assert "NUL" in problem_for(problems_of(tree), key_path)


@pytest.mark.parametrize("key_path, tree", [
    ("handlers.path", {"handlers": {"path": "hand\ud800lers"}}),
    ("database.data_dir", {"database": {"data_dir": "pg\ud800data"}}),
])
def test_a_folder_no_file_name_can_hold_is_a_problem(key_path, tree):
    assert "no file name can" in problem_for(problems_of(tree), key_path)


@pytest.mark.parametrize("key_path, tree", [
    ("handlers.path", {"handlers": {"path": "loop/handlers"}}),
    ("database.data_dir", {"database": {"data_dir": "loop/pgdata"}}),
])
def test_a_folder_behind_a_symlink_loop_is_a_problem(tmp_path, key_path, tree):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert "Symlink loop" in problem_for(problems_of(tree, base_dir=tmp_path), key_path)
