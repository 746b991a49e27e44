"""A recording's verify cost measured afresh on this machine, with its model at hand: what ``specviz advise
FILE --fresh`` compares the recorded verify times with (:func:`~specviz.analysis.advise_load.compare_fresh`).

The recording's first session names its model, context sizes and prompt; :func:`measure_recorded` opens that
model (or another path given for it), evaluates the prompt and times verify batches up to the longest draft
recorded plus one (:func:`~specviz.decoding.verify_cost.measure_for_advice`) under the recorded verify-tile
knobs, with the threads the rounds ran with.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

from ..decoding.batch_cost import DRAFT_LENGTHS, PROMPT_TOKENS, BatchCostTable, measure_batch_cost
from ..decoding.events import BatchStepped, DraftProposed, Event, SessionStarted, Verified
from ..decoding.verify_cost import VerifyCostModel, measure_for_advice


def measure_recorded(
    events: Sequence[Event], model: str | None = None, longest: int | None = None
) -> VerifyCostModel | None:
    """The verify cost of the model ``events`` were recorded with (or ``model``), measured now on the recorded
    prompt, up to ``longest`` draft tokens plus one (default: the longest draft recorded; a draft tree's advice
    times as many rows as its largest tree verifies); None when the recording holds no session, the model file
    is not at hand or the context has no room for the measurement."""
    from ..decoding.session import Session

    started = next((e for e in events if isinstance(e, SessionStarted)), None)
    path = model or (started.model if started else "")
    if started is None or not path or not Path(path).is_file() or not started.prompt_tokens:
        return None
    if longest is None:
        longest = max((len(e.tokens) for e in events if isinstance(e, DraftProposed)), default=0)
    threads = next((e.n_threads for e in events if isinstance(e, Verified) and e.n_threads), None)
    n_ctx, n_batch, n_ubatch = started.n_ctx or 4096, started.n_batch or 512, started.n_ubatch or 512
    with Session(
        path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=threads, prefill=started.prefill
    ) as s:
        s.start(list(started.prompt_tokens), 1, "none")
        g = s.generation
        return measure_for_advice(s.ctx, g.history, started.knobs, longest, pending_in_cache=g.prefilled)


def recorded_load(events: Sequence[Event]) -> dict[int, float]:
    """How often a recording's batched run held each number of busy sequences in a decode
    (:class:`~specviz.decoding.events.BatchStepped`), as weights; empty for a run of one request at a time."""
    counts = Counter(e.busy for e in events if isinstance(e, BatchStepped) and e.busy)
    return {int(p): float(n) for p, n in sorted(counts.items())}


def measure_batch_cost_for(
    events: Sequence[Event], parallels: Sequence[int], model: str | None = None
) -> BatchCostTable | None:
    """The batch-cost table (:func:`~specviz.decoding.batch_cost.measure_batch_cost`) for the model ``events`` were
    recorded with (or ``model``), measured now: one sequence and each of ``parallels`` busy sequences × the
    default draft lengths, on a context holding that many sequences, the recorded prompt as the text. None when
    the model file is not at hand."""
    from ..backends.llama import LlamaContext, LlamaModel

    started = next((e for e in events if isinstance(e, SessionStarted)), None)
    path = model or (started.model if started else "")
    if started is None or not path or not Path(path).is_file():
        return None
    seqs = sorted({1, *parallels})
    widest = seqs[-1] * (DRAFT_LENGTHS[-1] + 1)
    per_seq = PROMPT_TOKENS + seqs[-1] + DRAFT_LENGTHS[-1] + 1
    text = list(started.prompt_tokens) or [1]
    text = (text * (1 + (per_seq + seqs[-1]) // len(text)))[: per_seq + seqs[-1] + 1]
    loaded = LlamaModel(path)
    ctx: LlamaContext | None = None
    try:
        ctx = LlamaContext(
            loaded,
            n_ctx=seqs[-1] * max(256, -(-per_seq // 256) * 256),
            n_batch=max(512, widest),
            n_ubatch=max(512, widest),
            n_seq_max=seqs[-1],
        )
        return measure_batch_cost(ctx, text, sequences=seqs)
    finally:
        if ctx is not None:
            ctx.close()
        loaded.close()
