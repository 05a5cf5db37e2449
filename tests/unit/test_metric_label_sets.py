"""18.6: every labelled counter has its known label sets at zero from the start, so that
rate() and an alert on it see a series before the first event (a counter that never counted
has no sample at all)."""

from __future__ import annotations

from prometheus_client import Counter

from supervisor import metrics


def labelled_counters():
    return {name: value for name, value in vars(metrics).items()
            if isinstance(value, Counter) and value._labelnames}


def test_every_labelled_counter_starts_at_zero_for_its_known_label_sets():
    metrics.start_worker_counters("default", ["echo", "mail"])
    metrics.start_supervisor_counters(["default"], ["echo", "mail"], ["nightly"])
    empty = sorted(name for name, counter in labelled_counters().items()
                   if not counter._metrics)
    assert not empty, f"counters with no series until their first event: {empty}"
    assert metrics.TASKS_TIMED_OUT.labels("default", "mail")._value.get() == 0
    assert ("mail", "FAILED") in metrics.LEASES_REAPED._metrics
    assert ("reaper", "echo") in metrics.TASKS_RETRIED._metrics
    assert ("nightly",) in metrics.TASKS_SCHEDULED._metrics
    assert {("default", r) for r in metrics.RECYCLE_REASONS} <= set(
        metrics.WORKERS_RECYCLED._metrics)
