"""Fixtures of the fault-injection suite (helpers live in faultkit.py)."""

import multiprocessing
import uuid

import pytest


@pytest.fixture
def marker():
    """A unique argv word: every process (and forked worker) started with it can be found."""
    return f"looptune-fault-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def no_worker_outlives_its_test():
    """Stop DataLoader workers a failed test left behind (its traceback keeps the iterator
    alive), so one failure does not fail every later test's no-process-left check. Each test
    asserts that itself first; this only cleans up after it."""
    yield
    for child in multiprocessing.active_children():
        child.terminate()
        child.join(5)
