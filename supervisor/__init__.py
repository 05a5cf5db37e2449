"""pgtaskd: a distributed task scheduler whose coordination lives in PostgreSQL.

The import name is ``supervisor`` (the user's choice). supervisord uses the same import
name: do not install both in one environment.
"""

from .errors import PermanentError, TaskCancelled

__version__ = "0.1.0"
__all__ = ["PermanentError", "TaskCancelled", "Client", "TaskFilter", "__version__"]


def __getattr__(name):
    # The client pulls in psycopg; handlers that only need PermanentError should not pay for it.
    if name in ("Client", "TaskFilter"):
        from . import client
        return getattr(client, name)
    raise AttributeError(f"module 'supervisor' has no attribute {name!r}")
