"""Waiting in tests for what another thread or process will do, bounded: the outcome decides, the
bound only ends a test that would otherwise hang."""
import time


def eventually(condition, timeout_s: float = 10.0) -> None:
    """Return once `condition()` is true; fail the test if it is still false after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.01)
