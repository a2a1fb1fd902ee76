"""Fixtures of the fault-injection suite (helpers live in faultkit.py)."""

import uuid

import pytest


@pytest.fixture
def marker():
    """A unique argv word: every process (and forked worker) started with it can be found."""
    return f"looptune-fault-{uuid.uuid4().hex[:12]}"
