"""A worker's SIGTERM handler must take no lock: Python runs it in the main thread between any
two bytecodes, even inside ``Event.clear()`` while that event's lock is held, and a handler
that then set the same event waited forever for its own thread (an idle child whose
supervisor was killed hung so, now and then)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import os, signal, sys, threading, time
    from supervisor.worker.main import stop_on_signals

    event = threading.Event()
    stop_on_signals(event.set)
    with event._cond:  # as inside event.clear(): the event's own lock, held by this thread
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)  # bytecodes run here: a handler that set the event would hang now
    print("released", flush=True)
    print("stopped" if event.wait(5) else "not stopped", flush=True)
""")


def test_a_sigterm_while_the_main_thread_holds_the_events_lock_still_stops():
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                            timeout=20)
    assert result.stdout.split() == ["released", "stopped"], result.stderr
