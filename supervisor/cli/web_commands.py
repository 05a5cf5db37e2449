"""``pgtaskd web`` (the console, or ``hash-password`` for its config) and ``pgtaskd
web-bench`` (its page timings on a filled scratch schema)."""

from __future__ import annotations

import getpass
import sys

from ..config import Config
from ..errors import EXIT_OK, UsageError


def _needs_web_extra() -> None:
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"pgtaskd web needs the web extra ({exc.name} is missing): "
                         f"pip install 'pgtaskd[web]'") from None


def cmd_web(args, config: Config) -> int:
    if args.action == "hash-password":
        return _hash_password()
    _needs_web_extra()
    from ..web.server import serve

    return serve(config)


def _hash_password() -> int:
    from ..web.passwords import hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise UsageError("the two passwords differ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise UsageError("password: must not be empty")
    if len(password) > 1024:
        raise UsageError("password: longer than 1024 characters")
    print(hash_password(password))
    return EXIT_OK


def cmd_web_bench(args, config: Config) -> int:
    _needs_web_extra()
    from .web_bench import run_web_bench

    return run_web_bench(config, finished=args.finished, pending=args.pending,
                         requests=args.requests, keep=args.keep, as_json=args.json)
