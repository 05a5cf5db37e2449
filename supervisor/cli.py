"""The ``pgtaskd`` command line.

Every command takes ``-c/--config`` (or ``$PGTASKD_CONFIG``). Errors are one line on stderr
and an exit code: 2 for bad input (arguments, config, payload), 1 for operational failures
(database unreachable, task missing). No traceback reaches an operator.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from .config import load_config
from .errors import (EXIT_FAILURE, EXIT_OK, EXIT_USAGE, ConfigError, OperationalError,
                     UsageError)

EPILOG = textwrap.dedent("""\
    examples:
      pgtaskd run -c etc/pgtaskd.yaml            run the daemon
      pgtaskd migrate -c etc/pgtaskd.yaml        create or upgrade the schema
      pgtaskd check-config -c etc/pgtaskd.yaml   validate the config and the handlers
    """)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2, never a usage dump."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", metavar="FILE",
                        help="YAML config file (default: $PGTASKD_CONFIG, else built-in defaults)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pgtaskd", description="A task scheduler coordinated by PostgreSQL.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = commands.add_parser(
        "run", help="run the supervisor daemon", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start the supervisor: it migrates the schema, forks the configured worker "
                    "children and watches them until SIGTERM.",
        epilog="example:\n  pgtaskd run -c /etc/pgtaskd/pgtaskd.yaml")
    _add_config(run)
    run.add_argument("--no-migrate", action="store_true",
                     help="do not apply schema migrations at start (they must be applied already)")
    run.add_argument("--demo", action="store_true",
                     help="submit a few example tasks at start, to watch them being processed")

    worker = commands.add_parser(
        "worker", help="run one worker in the foreground (no supervisor)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a single claim-run-finalize loop in this process, for debugging.",
        epilog="example:\n  pgtaskd worker -c etc/pgtaskd.yaml --pool default")
    _add_config(worker)
    worker.add_argument("--pool", default=None, help="which pool's task types to run "
                                                    "(default: the first pool)")

    migrate = commands.add_parser(
        "migrate", help="create or upgrade the database schema",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Apply pending schema migrations. Idempotent, and safe when several "
                    "daemons run it at once.",
        epilog="example:\n  pgtaskd migrate -c etc/pgtaskd.yaml")
    _add_config(migrate)

    check = commands.add_parser(
        "check-config", help="validate the config and import every handler",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Validate the YAML and import every handler in a subprocess. Prints one "
                    "line per problem; exits 0 when all is well, 2 otherwise.",
        epilog="example:\n  pgtaskd check-config -c etc/pgtaskd.yaml")
    _add_config(check)
    return parser


def main(argv=None) -> int:
    try:
        return _dispatch(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"config error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except OperationalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130


def _dispatch(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    from . import commands
    return getattr(commands, "cmd_" + args.command.replace("-", "_"))(args, load_config(args.config))


if __name__ == "__main__":
    sys.exit(main())
