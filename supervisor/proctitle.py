"""Process titles, so ``ps`` shows what each pgtaskd process is doing."""

from __future__ import annotations

try:
    from setproctitle import setproctitle as _set
except ImportError:  # pragma: no cover - setproctitle is a dependency; stay usable without it
    def _set(title: str) -> None:
        pass


def supervisor_title(config_path) -> None:
    _set(f"pgtaskd: supervisor {config_path or '(defaults)'}")


def worker_title(pool: str, slot: int, state: str) -> None:
    _set(f"pgtaskd: worker {pool}#{slot} {state}")
