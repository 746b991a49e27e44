"""One llama.cpp decode at a time across the sessions of a server process, granted a whole round at a time.

``specviz serve`` gives every browser page its own :class:`~specviz.decoding.session.Session` on one loaded model.
Each llama.cpp context runs its decodes with every core, so two sessions decoding at once do not go
faster than one: they thrash (measured: eight playing pages made a third of one page's tokens). The
:class:`RoundScheduler` lets one session decode at a time and hands the turn on in arrival order.

A turn covers a whole round (``Session.step``: draft, one verify batch, accept, roll back), never a
single decode: a round is the unit every page shows, and cutting one in the middle would leave the
drafter's context and the target's cache out of step while another session runs. A page that is
playing asks for its next turn as soon as its round ends, so it queues behind every page that was
already waiting: the turns go round-robin between the playing pages and none of them starves.

No UI library is imported here.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from contextlib import contextmanager
from typing import Any, Iterator


class RoundScheduler:
    """Grants turns (one holder at a time) in the order they were asked for.

    ``with scheduler.turn(owner): session.step()`` runs the round when every owner that asked before
    has had its turn. A thread that already holds the turn may ask again (the inner request is granted
    at once), so a call that takes a turn can call another that takes one.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[tuple[Any, object]] = deque()  # (owner, ticket), in arrival order
        self._holder: Any = None
        self._holder_thread: int | None = None
        self._depth = 0
        #: Turns granted so far, by owner (for the tests and the load benchmark).
        self.grants: Counter = Counter()
        #: The owners in the order they were granted their turns (the newest 4096).
        self.history: deque[Any] = deque(maxlen=4096)

    @contextmanager
    def turn(self, owner: Any) -> Iterator[None]:
        """Hold the turn for the ``with`` block; waits until every earlier request has been served."""
        me = threading.get_ident()
        with self._cond:
            if self._holder_thread == me:  # nested request of the holder: already ours
                self._depth += 1
            else:
                ticket = object()
                self._queue.append((owner, ticket))
                while self._holder_thread is not None or self._queue[0][1] is not ticket:
                    self._cond.wait()
                self._queue.popleft()
                self._holder, self._holder_thread, self._depth = owner, me, 1
                self.grants[owner] += 1
                self.history.append(owner)
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._holder, self._holder_thread, self._depth = None, None, 0
                    self._cond.notify_all()

    @property
    def holder(self) -> Any:
        """The owner holding the turn now (``None`` when free)."""
        return self._holder

    def waiting(self) -> list[Any]:
        """The owners waiting for a turn, first in line first."""
        with self._cond:
            return [owner for owner, _ in self._queue]
