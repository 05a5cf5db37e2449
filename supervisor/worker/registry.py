"""Resolving task types to handler functions from the configured handlers folder."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Callable, Mapping

from ..errors import ConfigError

Handler = Callable[..., object]


def load_handlers(path: Path, types: Mapping[str, str],
                  only: tuple[str, ...] | None = None) -> dict[str, Handler]:
    """Import ``module:function`` for each task type; a ConfigError lists every failure.

    Only a fresh interpreter should call this: it is what makes SIGHUP reload handler code.
    """
    folder = str(Path(path).resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    handlers: dict[str, Handler] = {}
    problems = []
    for task_type, spec in types.items():
        if only is not None and task_type not in only:
            continue
        module_name, _, function_name = spec.partition(":")
        where = f"handlers.types.{task_type}"
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # a handler module may raise anything at import
            problems.append(f"{where}: cannot import {module_name!r} from {folder}: "
                            f"{type(exc).__name__}: {exc}")
            continue
        function = getattr(module, function_name, None)
        if not callable(function):
            problems.append(f"{where}: module {module_name!r} has no function {function_name!r}")
            continue
        if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
            # Calling one runs none of its body: the task would be recorded COMPLETED unrun.
            problems.append(f"{where}: {spec} is a generator function; a handler must be a "
                            "plain or async def function")
            continue
        handlers[task_type] = function
    if problems:
        raise ConfigError(problems)
    return handlers
