"""Test support: every message Python sends a page, as the tests' sinks see it, is checked against the page
protocol's declaration (``widgets/protocol.json``, ``to_page``).

A sink calls :func:`check_sent` for each message; a module that imports :func:`sent_messages_are_declared`
(an autouse fixture) fails each of its tests in which a message did not match its declaration.
"""

from __future__ import annotations

import threading

import pytest

from specviz.ui.protocol import outgoing_problem

_problems: list[str] = []
_lock = threading.Lock()


def check_sent(msg: object) -> None:
    """Record what is wrong with ``msg`` against the declaration (nothing when it matches)."""
    problem = outgoing_problem(msg)
    if problem is not None:
        with _lock:
            _problems.append(problem)


@pytest.fixture(autouse=True)
def sent_messages_are_declared():
    """Fail the test if a message a sink saw was not declared with the fields it has."""
    with _lock:
        _problems.clear()
    yield
    with _lock:
        found, _problems[:] = list(_problems), []
    assert not found, f"messages sent to the page that protocol.json does not declare: {found[:5]}"
