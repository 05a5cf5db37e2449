"""A handler module that cannot be imported: a worker child that loads it fails to boot.

Used by tests/system to check that the supervisor trips the pool's fuse instead of
restarting such children forever.
"""

raise RuntimeError("broken_import: this module fails at import on purpose")


def handle(task):  # pragma: no cover - never reached
    pass
