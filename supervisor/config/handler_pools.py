"""The handlers and pools sections: which function runs each task type, and which worker
children claim which types.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..errors import quote
from .defaults import (CANCEL_MODES, DEFAULT_HANDLERS_PATH, MAX_BATCH_SIZE, MAX_CONCURRENCY,
                       MAX_PROCESSES, MIN_TIMEOUT)
from .model import DEFAULT_POLICY, HandlersConfig, PoolConfig, RunPolicy
from .validator import Validator, shown_key, type_name

_HANDLER_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_POOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


def parse_handlers(v: Validator, tree: Mapping) -> HandlersConfig:
    section = v.section(tree, "handlers", "", {"path", "types"})
    types_tree = section.get("types") or {}
    types: dict[str, str] = {}
    policies: dict[str, RunPolicy] = {}
    if not isinstance(types_tree, dict):
        v.problem("handlers.types", f"must be a mapping of task type to module:function, "
                                    f"got {type_name(types_tree)}")
    else:
        for task_type, spec in types_tree.items():
            where = f"handlers.types.{shown_key(task_type)}"
            if not v.task_type(where, task_type):
                continue
            if isinstance(spec, dict):
                spec, policy = _parse_handler_mapping(v, spec, where)
                if policy != DEFAULT_POLICY:
                    policies[task_type] = policy
            if not isinstance(spec, str) or not _HANDLER_SPEC.match(spec):
                v.problem(where, f"must be 'module:function' (like 'echo:handle'), or a mapping "
                                 f"with handler, timeout and cancel, got {quote(spec)}")
            else:
                types[task_type] = spec
    return HandlersConfig(path=v.directory(section, "path", "handlers", DEFAULT_HANDLERS_PATH),
                          types=types, policies=policies)


def _parse_handler_mapping(v: Validator, spec: dict, where: str) -> tuple[Any, RunPolicy]:
    """``{handler: module:function, timeout: seconds, cancel: cooperative | kill}``."""
    v.unknown(spec, where, {"handler", "timeout", "cancel"})
    cancel = v.string(spec, "cancel", where, "cooperative")
    if cancel not in CANCEL_MODES:
        v.problem(f"{where}.cancel", f"must be one of {', '.join(CANCEL_MODES)}, "
                                     f"got {quote(cancel)}")
        cancel = "cooperative"
    policy = RunPolicy(timeout=v.number(spec, "timeout", where, None, minimum=MIN_TIMEOUT,
                                        strict=False), cancel=cancel)
    return spec.get("handler"), policy


def parse_pools(v: Validator, tree: Mapping, handlers: HandlersConfig) -> tuple[PoolConfig, ...]:
    raw = tree.get("pools")
    if raw is None:
        return (PoolConfig("default", 1, tuple(sorted(handlers.types))),)
    if not isinstance(raw, dict):
        v.problem("pools", f"must be a mapping of pool name to settings, got {type_name(raw)}")
        return ()
    pools = []
    for name, settings in raw.items():
        where = f"pools.{shown_key(name)}"
        if not isinstance(name, str) or not _POOL_NAME.match(name):
            v.problem(where, "a pool name must be 1-40 letters, digits, '_' or '-'")
            continue
        settings = settings or {}
        if not isinstance(settings, dict):
            v.problem(where, f"must be a mapping, got {type_name(settings)}")
            continue
        v.unknown(settings, where, {"processes", "task_types", "batch_size",
                                    "max_tasks_per_child", "max_memory_mb", "concurrency"})
        processes = v.integer(settings, "processes", where, 1, minimum=0,
                              maximum=MAX_PROCESSES)
        max_tasks = v.integer(settings, "max_tasks_per_child", where, None, minimum=1,
                              maximum=1_000_000_000)
        max_memory = v.number(settings, "max_memory_mb", where, None, maximum=1024 * 1024,
                              unit="megabytes")
        batch_size = v.integer(settings, "batch_size", where, 1, minimum=1,
                               maximum=MAX_BATCH_SIZE)
        task_types = settings.get("task_types")
        if task_types is None:
            chosen = tuple(sorted(handlers.types))
        elif not isinstance(task_types, list) or not all(isinstance(t, str) for t in task_types):
            v.problem(f"{where}.task_types", "must be a list of task type names")
            chosen = ()
        else:
            for i, t in enumerate(task_types):
                if not v.task_type(f"{where}.task_types[{i}]", t):
                    continue
                if t not in handlers.types:
                    v.problem(f"{where}.task_types",
                              f"{quote(t)} has no handler under handlers.types")
            chosen = tuple(dict.fromkeys(task_types))
        concurrency = v.integer(settings, "concurrency", where, 1, minimum=1,
                                maximum=MAX_CONCURRENCY)
        if concurrency > 1:
            _check_concurrent(v, where, handlers, chosen, batch_size)
        pools.append(PoolConfig(name, processes, chosen, batch_size,
                                max_tasks_per_child=max_tasks, max_memory_mb=max_memory,
                                concurrency=concurrency))
    return tuple(pools)


def _check_concurrent(v: Validator, where: str, handlers: HandlersConfig,
                      task_types: tuple[str, ...], batch_size: int) -> None:
    """What a child running several tasks at once cannot honour, refused here rather than
    half-kept at run time."""
    if batch_size > 1:
        # A concurrent child claims as many tasks as it has room for, and starts each at once:
        # there is no batch left to wait in.
        v.problem(f"{where}.batch_size", f"must be 1 when {where}.concurrency is above 1 (a "
                                         "concurrent child claims as much as it has room for)")
    for task_type in task_types:
        policy = handlers.policy(task_type)
        if not policy.watched:
            continue
        # A thread cannot be killed, and killing the child would end its other tasks too.
        key = "timeout" if policy.timeout is not None else "cancel"
        v.problem(f"handlers.types.{shown_key(task_type)}.{key}",
                  f"cannot be enforced in {where}, whose concurrency is above 1 (the "
                  f"supervisor can only kill a whole child): give {quote(task_type)} a pool "
                  "with concurrency 1")
