"""Exporting a trained head to GGUF, in the storage type that drafts fastest on this machine.

On a CPU a one-token draft step reads every weight of the head once, so its storage type sets its cost
(``benchmarks/bench_eagle3.py``: a Q8_0 head steps in a third of an f32 head's time). The candidates are
written side by side, each is timed over the same one-pair draft steps on the target (after a warm-up,
the fastest of a few repeats), and the fastest is kept; quantisation error is reported as the share of
draft steps whose argmax differs from the float32 head's.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..models.eagle3_gguf import write_eagle3_head
from .model import Eagle3Head

__all__ = ["ExportResult", "export_head"]


@dataclass
class ExportResult:
    """The written head, its storage type, and what each candidate measured."""

    path: Path
    dtype: str
    step_ms: dict[str, float]
    argmax_agreement: dict[str, float]

    def describe(self) -> str:
        """One line for the report."""
        cands = ", ".join(
            f"{k} {v:.2f} ms/step (argmax agrees with f32 on {self.argmax_agreement.get(k, 1.0):.1%})"
            for k, v in self.step_ms.items()
        )
        return f"wrote {self.path} as {self.dtype}; measured draft steps: {cands}"


def _time_and_agree(
    target_ctx: object, head_path: Path, pairs: Sequence[tuple[int, np.ndarray]], repeats: int, n_threads: int | None
) -> tuple[float, np.ndarray]:
    """(median-of-best milliseconds per one-pair draft step, the argmax of each step) of the head at ``head_path``."""
    from ..backends import LlamaModel
    from ..backends.eagle3 import Eagle3Context

    m = LlamaModel(head_path)
    d = Eagle3Context(m, target_ctx, n_threads=n_threads)  # type: ignore[arg-type]
    try:
        best = float("inf")
        picks = np.zeros(len(pairs), dtype=np.int64)
        for _ in range(repeats):
            d.clear()
            t0 = time.perf_counter()
            for i, (tok, g) in enumerate(pairs):
                d.decode([tok], g[None, :], i, outputs=[0])
                picks[i] = int(np.argmax(d.logits(0)))
            best = min(best, time.perf_counter() - t0)
        return 1e3 * best / max(1, len(pairs)), picks
    finally:
        d.close()
        m.close()


def export_head(
    head: Eagle3Head,
    target: str | Path,
    output: str | Path,
    *,
    dtype: str = "auto",
    candidates: Sequence[str] = ("f16", "q8_0"),
    work: str | Path | None = None,
    n_threads: int | None = None,
    metadata: dict[str, object] | None = None,
    pairs: Sequence[tuple[int, np.ndarray]] | None = None,
) -> ExportResult:
    """Write ``head`` to ``output``: as ``dtype``, or (``"auto"``) as the fastest of ``candidates`` measured here.

    ``pairs`` are the ``(token, g)`` pairs decoded one per step at positions ``0, 1, …`` for the timing and
    the argmax comparison (real ones from the corpus give a meaningful agreement; default: random ones).
    """
    from ..backends import LlamaContext, LlamaModel

    output = Path(output)
    weights = head.gguf_weights()
    meta = dict(metadata or {})
    if dtype != "auto":
        write_eagle3_head(
            output, target, head.cfg, weights, dtype=dtype, name="specviz trained eagle3 head", extra_metadata=meta
        )
        return ExportResult(output, dtype, {}, {})
    work = Path(work) if work is not None else output.parent
    work.mkdir(parents=True, exist_ok=True)
    paths = {}
    for c in ("f32", *candidates):
        paths[c] = write_eagle3_head(
            work / f"{output.stem}.{c}.gguf",
            target,
            head.cfg,
            weights,
            dtype=c,
            name="specviz trained eagle3 head",
            extra_metadata=meta,
        )
    tm = LlamaModel(target)
    ctx = LlamaContext(tm, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=n_threads)
    try:
        if pairs is None:
            rng = np.random.default_rng(0)
            toks = [int(t) for t in rng.choice(np.asarray(head.cfg.d2t), size=48)]
            g = rng.standard_normal((len(toks), head.cfg.n_embd)).astype(np.float32) * 10
            pairs = list(zip(toks, g))
        pairs = list(pairs)[: ctx.capacity.n_ctx - 1]
        times: dict[str, float] = {}
        agree: dict[str, float] = {}
        _, ref = _time_and_agree(ctx, paths["f32"], pairs, 1, n_threads)
        for c in candidates:
            ms, picks = _time_and_agree(ctx, paths[c], pairs, 3, n_threads)
            times[c] = ms
            agree[c] = float((picks == ref).mean())
    finally:
        ctx.close()
        tm.close()
    best = min(times, key=lambda k: times[k])
    shutil.copyfile(paths[best], output)
    for p in paths.values():
        p.unlink(missing_ok=True)
    return ExportResult(output, best, times, agree)
