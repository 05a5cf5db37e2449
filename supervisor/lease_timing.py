"""How a lease's time is spent: the worker's safety margin, the keeper's retry, and the rule
that a config's lease settings must leave a renewal time to land.

The worker, the lease keeper and the config each need these numbers; they live here so that
the config's check is derived from what the other two actually do.
"""

from __future__ import annotations

# The lease counts as lost this long before it runs out by the worker's clock: 5% of it, at
# most a second. The worker's clock starts the lease just before the database's does, so
# without a margin a handler would stop, at its next safe point, just after another worker
# could claim its task. One that checks is_cancelled() at least this often stops before;
# the margin also dwarfs how far two hosts' clocks can drift over a lease (NTP slews a
# clock by 0.05% at most).
MAX_LEASE_MARGIN = 1.0
# A renewal that failed (a dropped connection, a statement past its deadline) is tried again
# this soon, as a fraction of the renew interval, at most a second: the lease is still running.
RENEW_RETRY_FRACTION = 0.25
MAX_RENEW_RETRY_DELAY = 1.0


def stop_margin(lease_seconds: float) -> float:
    """How long before its lease ends a worker already counts its task as lost."""
    return min(MAX_LEASE_MARGIN, lease_seconds * 0.05)


def renew_retry_delay(renew_interval: float) -> float:
    """How soon the keeper tries a failed renewal again."""
    return min(MAX_RENEW_RETRY_DELAY, renew_interval * RENEW_RETRY_FRACTION)


def renewal_problem(lease_seconds: float, renew_interval: float) -> str | None:
    """Why these settings leave a renewal no time to land, or None.

    A renewal is sent ``renew_interval`` after the lease began, and the worker stops trusting
    the lease ``stop_margin`` before it ends. A renewal due at the last moment fails every task
    that outlives one interval, and one that leaves no room for a single retry turns any
    brief database hiccup into a lost lease; so the interval plus one retry must fit before
    the margin."""
    needed = renew_interval + renew_retry_delay(renew_interval)
    trusted = lease_seconds - stop_margin(lease_seconds)
    if needed <= trusted:
        return None
    return (f"leaves a renewal no time to land before the worker stops trusting its lease: "
            f"lease.renew_interval + one retry (min({MAX_RENEW_RETRY_DELAY:g}, "
            f"renew_interval/4)) must be at most lease.seconds - min({MAX_LEASE_MARGIN:g}, "
            f"5% of lease.seconds), got {renew_interval:g} + "
            f"{renew_retry_delay(renew_interval):g} > {lease_seconds:g} - "
            f"{stop_margin(lease_seconds):g}")
