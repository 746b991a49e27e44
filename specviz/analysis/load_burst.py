"""A batched run replayed from a recording: requests that arrive together, their recorded rounds capped by a draft
schedule, run N at a time on N slots as :class:`~specviz.decoding.batch.BatchRun` runs them, every decode priced as
llama.cpp lays it out. What it adds to the steady-state model of :mod:`.load_schedule` (every slot always busy) is
the **makespan**: the slots that fall idle as requests finish, and the tail in which the last requests run with few
others, where a split cache's idle slots also split the batch into more micro-batches.

The run, for ``slots`` slots and a queue of requests (each request: its recorded rounds in order, drafted ``L_i``,
accepted ``n_i``):

- every step, free slots take the next queued requests (a slot freed in a step is taken at the next, as
  :class:`~specviz.decoding.batch.BatchRun` admits them); ``busy`` is the slots holding a request;
- the draft cap is the schedule's length at ``busy``; each busy request plays its next round capped at it: the
  round verifies ``1 + min(L, k)`` rows and commits ``min(n, L, k) + 1`` tokens, and where the whole chunk was
  accepted and the recorded round accepted more, the request's next step copies on from there (:func:`capped_step`,
  one step at a time, since the cap can change between steps); a request ends with its last recorded round;
- the step takes :func:`~specviz.decoding.batch_layout.layout_seconds` of its rows (idle slots add none) plus
  ``busy`` × the lane seconds (each request's own work besides the decode).

The run's total tokens/s is every request's tokens over the sum of its steps' seconds, the prompts aside (they
cost the same whatever the draft length). Several bursts drawn from the recorded requests (:func:`draw_bursts`,
seeded) are pooled as one ratio of sums.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

import numpy as np

from ..decoding.batch_cost import BatchCostTable
from ..decoding.batch_layout import layout_seconds
from ..decoding.events import SessionStarted
from .advise_rounds import collect
from .sources import events_of

__all__ = ["Request", "burst_rate", "capped_step", "draw_bursts", "recorded_requests"]

#: A request as the replay plays it: its recorded rounds in order, ``(drafted, accepted)`` each.
Request = tuple[tuple[int, int], ...]


def capped_step(drafted: int, accepted: int, k: int) -> tuple[int, int, tuple[int, int] | None]:
    """One round of a recorded one that drafted ``drafted`` and accepted ``accepted``, its draft capped at ``k``: the
    rows it verifies, the tokens it commits and what is left of the recorded round for the next (None: it is done).

    Acceptance is a prefix: capped, the round drafts ``d = min(drafted, k)`` and accepts ``min(accepted, d)``.
    Where that whole chunk was accepted and the recorded round accepted more, the target's own next token is the
    draft's next one, and the next round drafts the rest of the same continuation (``drafted - d - 1`` left, of
    which ``accepted - d - 1`` accepted). Where the recorded round refused within the chunk, or its draft or its
    accepted tokens end there, it is done (past a recorded draft, what the drafter would draft is not known)."""
    d = min(drafted, k)
    a = min(accepted, d)
    if a < d or accepted == a or drafted == d:
        return d + 1, a + 1, None
    return d + 1, a + 1, (drafted - a - 1, accepted - a - 1)


def recorded_requests(events: Any, group: str) -> list[Request]:
    """The requests of a recording (or a session's events) whose rounds belong to ``group`` (an
    :func:`~specviz.analysis.advise_rounds.group_label`): one per generation (each ``SessionStarted`` begins one),
    its rounds in order; a generation with no round in the group is left out."""
    out: list[Request] = []
    segment: list[Any] = []
    for ev in [*events_of(events), None]:
        if ev is None or (isinstance(ev, SessionStarted) and segment):
            rounds = collect(segment).rounds.get(group)
            if rounds is not None and len(rounds.length):
                out.append(tuple(zip(rounds.length.tolist(), rounds.accepted.tolist())))
            segment = []
        if ev is not None:
            segment.append(ev)
    return out


def draw_bursts(n_requests: int, bursts: int, size: int, rng: np.random.Generator) -> list[list[int]]:
    """``bursts`` queues of ``size`` request indexes each: random orders of ``0 … n_requests − 1`` one after another,
    cut into queues. Every recorded request is drawn as often as every other (to one), so the pooled rate carries
    no noise from the mix of requests drawn, only from which arrive together and in what order."""
    need = bursts * size
    order = np.concatenate([rng.permutation(n_requests) for _ in range(-(-need // n_requests))])
    return order[:need].reshape(bursts, size).tolist()


def burst_rate(
    requests: Sequence[Request],
    queues: Sequence[Sequence[int]],
    slots: int,
    by_busy: Sequence[int],
    table: BatchCostTable,
    *,
    unified: bool,
    lane: float,
) -> float:
    """Total tokens/s of the runs of ``queues`` (each a burst: indexes into ``requests``, all queued at the start) on
    ``slots`` slots, every draft capped at ``by_busy[busy - 1]`` while ``busy`` slots hold a request, priced on
    ``table`` as laid out in a ``unified`` cache or a split one (see the module docstring)."""
    tokens = 0
    seconds = 0.0
    for queue in queues:
        t, s = _one_burst(requests, queue, slots, by_busy, table, unified, lane)
        tokens += t
        seconds += s
    return tokens / seconds if seconds > 0 else 0.0


def _one_burst(
    requests: Sequence[Request],
    queue: Sequence[int],
    slots: int,
    by_busy: Sequence[int],
    table: BatchCostTable,
    unified: bool,
    lane: float,
) -> tuple[int, float]:
    """One burst's tokens and seconds. A slot's state is ``[request, round index, drafted left, accepted left]``."""
    waiting = deque(queue)
    state: list[list[int] | None] = [None] * slots
    tokens, seconds = 0, 0.0
    while True:
        for i in range(slots):
            if state[i] is None and waiting:
                r = waiting.popleft()
                state[i] = [r, 0, *requests[r][0]]
        busy = sum(1 for st in state if st is not None)
        if busy == 0:
            return tokens, seconds
        k = by_busy[busy - 1]
        rows = [0] * slots
        for i, st in enumerate(state):
            if st is None:
                continue
            rows[i], made, rest = capped_step(st[2], st[3], k)
            tokens += made
            if rest is not None:  # the chunk was accepted and the recorded round accepted more: copy on next step
                st[2], st[3] = rest
                continue
            st[1] += 1
            rounds = requests[st[0]]
            if st[1] == len(rounds):
                state[i] = None
            else:
                st[2], st[3] = rounds[st[1]]
        seconds += layout_seconds(table, rows, unified) + busy * lane
