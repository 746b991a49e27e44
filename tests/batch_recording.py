"""A batched run's recording for the inspector's tests: a tiny model's requests run three at a time
(:class:`~specviz.decoding.batch.BatchRun`), every request's events in submission order and then the run's
``batch_step`` events, written by a :class:`~specviz.decoding.recorder.Recorder`."""

from __future__ import annotations

from pathlib import Path

from specviz.decoding.batch import BatchRun
from specviz.decoding.recorder import Recorder

#: Four requests on three slots: the fourth waits for a free slot; lengths differ, so they finish apart.
PROMPTS = ["the a of the a of the a of", "of of the a the of of the a the", "a a a of the the a", "the the of a"]
LENGTHS = [40, 20, 30, 25]


def record_batched_run(model_path: str | Path, path: Path, n_parallel: int = 3) -> list:
    """Run :data:`PROMPTS` with prompt lookup on ``n_parallel`` slots and record the run into ``path``; the
    run's ``batch_step`` events (as dictionaries)."""
    with BatchRun(model_path, n_parallel=n_parallel, n_ctx=512 * n_parallel, n_batch=64, n_ubatch=64, n_threads=1) as b:
        for prompt, n in zip(PROMPTS, LENGTHS):
            b.submit(prompt, n, "prompt-lookup", draft_max=6, max_ngram=2, min_ngram=1)
        results = b.run()
        with Recorder(path) as rec:
            for r in results:
                for e in r.events:
                    rec(e)
            for e in b.events:
                rec(e)
        return [e.to_dict() for e in b.events]
