"""What a worker records of a failed run (supervisor/worker/failures.py), without a database."""

from __future__ import annotations

from supervisor.worker.failures import MAX_TRACEBACK_BYTES, bounded, failure_of


def test_a_long_traceback_keeps_its_head_and_tail_within_the_bound_in_bytes():
    text = "Traceback (most recent call last):\n" + "é€" * 20_000 + "\nValueError: the end\n"
    kept = bounded(text)
    assert len(kept.encode("utf-8")) <= MAX_TRACEBACK_BYTES
    assert kept.startswith("Traceback (most recent call last):\né€")
    assert kept.endswith("€\nValueError: the end\n")
    assert f"({len(text.encode()):,} bytes; the middle left out)" in kept
    assert bounded("short\n") == "short\n"


def test_a_message_that_cannot_be_read_or_stored_is_still_recorded():
    class Hostile(Exception):
        def __str__(self):
            raise RuntimeError("no")

    try:
        raise ValueError("bad\x00byte \udcff")
    except ValueError as exc:
        readable = failure_of(exc, permanent=False)
    assert (readable.outcome, readable.error_type) == ("exception", "ValueError")
    assert readable.message == "bad\\x00byte \\udcff"
    assert readable.traceback.endswith("ValueError: bad\\x00byte \\udcff\n")
    hostile = failure_of(Hostile(), permanent=True)
    assert hostile.outcome == "permanent" and hostile.traceback is None
    assert hostile.message == "(its message could not be read: str() raised RuntimeError)"
    assert hostile.error_type.endswith("Hostile")
