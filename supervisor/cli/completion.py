"""``pgtaskd completion bash|zsh``: a shell completion script, generated from the parser.

shtab writes it: a static script (no Python runs at each Tab), built from the same argparse
tree that parses the commands, so every command and option completes as it is today. After
an upgrade, generate it again for the new options.
"""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh")

# Options whose value is a path: completed as file names, not left to the shell's default.
_FILE_OPTIONS = {"--config", "--payload-file"}


def add_completion_command(commands) -> None:
    completion = commands.add_parser(
        "completion", help="print a bash or zsh completion script",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print the completion script of SHELL, generated from this parser: every "
                    "command and option of this version completes. Install it once, and "
                    "again after an upgrade (see Shell completion in the README).",
        epilog="examples:\n"
               "  pgtaskd completion bash > ~/.local/share/bash-completion/completions/pgtaskd\n"
               "  pgtaskd completion zsh > ~/.zfunc/_pgtaskd")
    completion.add_argument("shell", metavar="SHELL", choices=SHELLS, help="bash or zsh")


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    # Imported here: every other command builds this parser too, and needs no shtab.
    import shtab

    _mark_file_options(parser, shtab.FILE)
    return shtab.complete(parser, shell=shell)


def _mark_file_options(parser: argparse.ArgumentParser, complete) -> None:
    for action in parser._actions:
        if _FILE_OPTIONS.intersection(action.option_strings):
            action.complete = complete
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                _mark_file_options(subparser, complete)


def cmd_completion(args, parser: argparse.ArgumentParser) -> int:
    print(completion_script(parser, args.shell), end="")
    return 0
