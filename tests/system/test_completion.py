"""`pgtaskd completion bash|zsh`: the scripts are valid, bash, given the script as a user
installs it, completes commands, options, choices and file names, and zsh's compinit takes
the zsh one from a folder on $fpath."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from cli_runs import assert_refused, pgtaskd

# Sources the script, then asks its completion function what it offers for the words given
# (the last one being completed), one per line, as bash would on Tab.
BASH_COMPLETE = r"""
source "$1"; shift
words=("$@")
function=$(complete -p pgtaskd | sed -E 's/.* -F ([^ ]+) .*/\1/')
COMP_WORDS=("${words[@]}")
COMP_CWORD=$(( ${#words[@]} - 1 ))
COMP_LINE="${words[*]}"
COMP_POINT=${#COMP_LINE}
"$function" pgtaskd "${words[-1]}" "${words[-2]}"
printf '%s\n' "${COMPREPLY[@]}"
"""


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """Both scripts, generated with a config that does not exist: none is read."""
    folder = tmp_path_factory.mktemp("completion")
    paths = {}
    for shell in ("bash", "zsh"):
        result = pgtaskd("completion", shell, dsn=None,
                         env={"PGTASKD_CONFIG": str(folder / "missing.yaml")})
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
        paths[shell] = folder / f"pgtaskd.{shell}"
        paths[shell].write_text(result.stdout)
    return paths


def offered(script, *words: str, cwd=None) -> list[str]:
    result = subprocess.run(["bash", "-c", BASH_COMPLETE, "complete", str(script),
                             "pgtaskd", *words], capture_output=True, text=True, cwd=cwd,
                            timeout=30)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    return sorted(filter(None, result.stdout.splitlines()))


def test_the_bash_script_is_valid_bash(scripts):
    result = subprocess.run(["bash", "-n", str(scripts["bash"])], capture_output=True,
                            text=True, timeout=30)
    assert (result.returncode, result.stderr) == (0, "")


def test_bash_completes_commands_options_choices_and_files(scripts, tmp_path):
    script = scripts["bash"]
    assert offered(script, "sub") == ["submit"]
    assert {"run", "submit", "list", "completion", "daemons"} <= set(offered(script, ""))
    assert offered(script, "submit", "echo", "--pri") == ["--priority"]
    assert offered(script, "list", "--st") == ["--status"]
    assert offered(script, "retry", "--dry") == ["--dry-run"]
    assert offered(script, "web", "hash") == ["hash-password"]
    assert offered(script, "completion", "") == ["bash", "zsh"]
    (tmp_path / "pgtaskd.yaml").write_text("{}\n")
    (tmp_path / "payload.json").write_text("{}\n")
    assert offered(script, "list", "-c", "pgt", cwd=tmp_path) == ["pgtaskd.yaml"]
    assert offered(script, "submit", "echo", "--payload-file", "pay", cwd=tmp_path) == \
        ["payload.json"]


def test_the_zsh_script_is_valid_zsh_and_names_every_command(scripts):
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh is not installed (.ci/run installs the Debian package zsh)")
    result = subprocess.run([zsh, "-n", str(scripts["zsh"])], capture_output=True, text=True,
                            timeout=30)
    assert (result.returncode, result.stderr) == (0, "")
    text = scripts["zsh"].read_text()
    for command in ("run", "submit", "list", "retry", "completion", "--payload-file"):
        assert command in text
    # Installed as the README says: a file _pgtaskd in a folder on $fpath, then compinit.
    folder = scripts["zsh"].parent / "zfunc"
    folder.mkdir()
    (folder / "_pgtaskd").write_text(text)
    registered = subprocess.run(
        [zsh, "-f", "-c", f"fpath=({folder} $fpath); autoload -U compinit; "
                          f"compinit -u -d {folder}/.zcompdump; print -r -- $_comps[pgtaskd]"],
        capture_output=True, text=True, timeout=30,
        env={"HOME": str(folder), "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert (registered.returncode, registered.stdout, registered.stderr) == (0, "_pgtaskd\n", "")


@pytest.mark.parametrize("arguments, fragment", [
    (["completion", "fish"], "argument SHELL: invalid choice: 'fish'"),
    (["completion"], "the following arguments are required: SHELL"),
])
def test_a_shell_it_cannot_complete_is_one_line_and_exit_2(arguments, fragment):
    assert_refused(pgtaskd(*arguments, dsn=None), 2, "pgtaskd completion: ", fragment)
