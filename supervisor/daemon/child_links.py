"""What the children say on their links, and what the supervisor does about it.

Each child reports over its socket pair: the claims it took (handed to the lease keeper to
renew), the ones it settled (dropped from it), when a watched run starts and ends, when it
goes idle, boots, fails to boot or waits for the database, and why it is about to exit.
"""

from __future__ import annotations

import logging
import time

from .children import Child, ClaimedTask
from ..logs import emit
from .run_policies import RunPolicies
from .services import Services


class ChildLinks:
    """Reads the children's links for the Arbiter's loop and applies their messages."""

    def __init__(self, services: Services, run_policies: RunPolicies):
        self.services = services
        self.run_policies = run_policies

    @property
    def keeper(self):
        return self.services.keeper

    def read(self, child: Child) -> None:
        messages, open_ = child.link.receive()
        for message in messages:
            try:
                self.on_message(child, message)
            except (KeyError, TypeError, ValueError) as exc:
                emit("bad_child_message", logging.WARNING, child_pid=child.pid,
                     kind=str(message.get("kind"))[:40], error=repr(exc)[:200])
        if not open_:
            child.link.close()
            child.link_closed_at = time.monotonic()

    def on_message(self, child: Child, message: dict) -> None:
        kind = message.get("kind")
        # Settled claims ride on the next message, whatever its kind.
        self.on_settled(child, message.get("done") or message.get("tokens") or ())
        if kind == "claimed":
            self.on_claimed(child, message["claims"])
        elif kind == "started":
            self.run_policies.started(child, message)
        elif kind == "ended":
            self.run_policies.settled(child, [int(message["token"])])
        elif kind == "stopping":
            if message.get("reason") == "recycle" and not child.stopping:
                # An expected exit: replaced at once, with no restart backoff.
                child.stopping = "recycle"
        elif kind == "idle":
            child.idle_since = float(message["since"])
            if self.services.relay is not None:
                self.services.relay.wake_if_missed(child)
        elif kind == "booted":
            child.booted = True
            child.worker_id = message.get("worker_id")
            emit("worker_booted", pool=child.pool, slot=child.slot, child_pid=child.pid,
                 generation=child.generation, worker_id=child.worker_id)
        elif kind == "boot_failed":
            child.boot_error = str(message.get("error"))
        elif kind == "waiting_db":
            child.waiting_db = True

    def on_settled(self, child: Child, tokens) -> None:
        if not tokens:
            return
        tokens = [int(t) for t in tokens]
        self.keeper.drop(tokens)
        self.run_policies.settled(child, tokens)
        for token in tokens:
            child.claims.pop(token, None)

    def on_claimed(self, child: Child, claims: list) -> None:
        # Not imported at the top: it imports prometheus_client, which must wait until the
        # metrics directory is set.
        from ..lease_keeper import Held

        child.idle_since = None
        child.claimed_any = True
        # Renewed by the lease settings the child claimed under, those of its generation,
        # whatever a reload changed since.
        lease = child.config.lease
        held = []
        for task_id, token, task_type in claims:
            token = int(token)
            child.claims[token] = ClaimedTask(str(task_id), str(task_type))
            held.append(Held(str(task_id), token, str(task_type), child.worker_id or "",
                             child.pool, holder=child, lease_seconds=lease.seconds,
                             renew_interval=lease.renew_interval))
        self.keeper.hold(held)
