"""The tree advice checked by running it: ``specviz advise REC --tree --check``.

:mod:`~specviz.analysis.tree_advice` predicts, from a chain recording, the accepted length and tokens/s of every
tree shape. :func:`check_tree` runs the shapes it names on the recording's prompt, target and draft model, with
the recording's sampling settings and length: the best chain (plain decoding where that was best, and then also
the chain as deep as the tree, so acceptance has a chain to compare with) and the best tree the draft strategy
drafts as shaped (:func:`~specviz.analysis.tree_advice.run_knobs`: ``tree_width W``, ``p_split`` 0, the node
budget as ``draft_max``). The settings run back to back within each repeat, so drift hits them alike; each row
gives the prediction beside the measurement: accepted length (tokens per drafting round, the target's own
included, as the prediction counts them), tokens/s (the median over repeats) and verify rows per drafting round.

A greedy rerun of the recorded chain on its own prompt commits the recorded tokens, so the chain's measured
accepted length meets the prediction (the rank shares were counted on those rounds) but for the rounds the
generation's end shortened; the tree's differs from its prediction by what the independence assumption misses.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..decoding.events import Event, SessionStarted, Verified
from ..decoding.machine_load import load_average
from ..errors import RecordingError
from .tree_advice import Scored, Shape, TreeAdvice, run_knobs


@dataclass(frozen=True)
class CheckedShape:
    """One setting run: the shape and its knobs (empty: plain decoding), the prediction, and the medians over
    repeats of what it measured (``branched``: the rounds that verified more than one branch, summed)."""

    shape: Shape
    knobs: dict[str, Any]
    predicted_accepted_length: float
    predicted_tokens_per_second: float
    accepted_length: float
    tokens_per_second: float
    rows_per_round: float
    rounds: int
    branched: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "shape": self.shape.label,
            "widths": list(self.shape.widths),
            "knobs": dict(self.knobs),
            "predicted_accepted_length": self.predicted_accepted_length,
            "predicted_tokens_per_second": self.predicted_tokens_per_second,
            "accepted_length": self.accepted_length,
            "tokens_per_second": self.tokens_per_second,
            "rows_per_round": self.rows_per_round,
            "rounds": self.rounds,
            "rounds_with_branches": self.branched,
        }


@dataclass(frozen=True)
class TreeCheck:
    """The settings run (chain first, the tree last), how, and the load average before and after."""

    rows: tuple[CheckedShape, ...]
    max_tokens: int
    repeats: int
    model: str
    draft_model: str
    load: tuple[tuple[float, float, float] | None, tuple[float, float, float] | None] = field(default=(None, None))

    def verdict(self) -> str:
        """The tree against each chain run (the best first), measured, beside what was predicted."""
        tree = self.rows[-1]

        def ratio(a: float, b: float) -> float:
            return a / b if b else 0.0

        against = [
            f"{ratio(tree.tokens_per_second, c.tokens_per_second):.2f}x the {c.shape.label}'s tokens/s (predicted "
            f"{ratio(tree.predicted_tokens_per_second, c.predicted_tokens_per_second):.2f}x)"
            for c in self.rows[:-1]
        ]
        return (
            f"measured: {tree.shape.label} at {', '.join(against)}; accepted length {tree.accepted_length:.2f} against "
            f"{tree.predicted_accepted_length:.2f} predicted"
        )

    def report(self) -> str:
        """The table and the verdict, as text."""
        lines = [
            f"checked on the recording's prompt ({self.max_tokens} tokens, median of {self.repeats}; load average "
            f"{_load(self.load[0])} before, {_load(self.load[1])} after):",
            f"  {'setting':<16}  {'accepted':>8}  {'predicted':>9}  {'tokens/s':>8}  {'predicted':>9}  "
            f"{'rows/round':>10}  {'branched':>8}",
        ]
        for r in self.rows:
            lines.append(
                f"  {r.shape.label:<16}  {r.accepted_length:>8.2f}  {r.predicted_accepted_length:>9.2f}  "
                f"{r.tokens_per_second:>8.1f}  {r.predicted_tokens_per_second:>9.1f}  {r.rows_per_round:>10.2f}  "
                f"{r.branched:>3}/{r.rounds:<4}"
            )
        lines.append(self.verdict())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form: ``rows`` (chain first, tree last), the run's length and the load average."""
        return {
            "rows": [r.to_dict() for r in self.rows],
            "max_tokens": self.max_tokens,
            "repeats": self.repeats,
            "model": self.model,
            "draft_model": self.draft_model,
            "load_average": {"before": self.load[0], "after": self.load[1]},
            "verdict": self.verdict(),
        }


def _load(avg: tuple[float, float, float] | None) -> str:
    return "unknown" if avg is None else f"{avg[0]:.2f}"


def check_shapes(advice: TreeAdvice) -> list[Scored]:
    """What :func:`check_tree` runs: the best chain, the chain as deep as the runnable tree where the best chain
    is another, and the runnable tree; :class:`~specviz.errors.RecordingError` where no tree runs."""
    tree = advice.runnable
    if tree is None:
        raise RecordingError(f"no tree to check: {advice.verdict() if advice.tree is None else advice.how_to_run()}")
    same_depth = next(s for s in advice.scored if s.shape.widths == (1,) * len(tree.shape.widths))
    chains = [advice.chain] if advice.chain is same_depth else [advice.chain, same_depth]
    return [*chains, tree]


def check_tree(
    events: Sequence[Event],
    advice: TreeAdvice,
    *,
    model: str | None = None,
    max_tokens: int | None = None,
    repeats: int = 3,
) -> TreeCheck:
    """Run :func:`check_shapes` on the recording's prompt (see the module docstring), on the recorded target (or
    ``model``) and draft model; :class:`~specviz.errors.RecordingError` where a file is not at hand, the
    recording holds no prompt or ran under a grammar (a grammar's rounds verify chains)."""
    from ..decoding.session import Session

    started = next((e for e in events if isinstance(e, SessionStarted)), None)
    if started is None or not started.prompt_tokens:
        raise RecordingError("the recording holds no session with a prompt to run the tree on")
    if started.grammar:
        raise RecordingError("the recording ran under a grammar, whose rounds verify a chain: a tree cannot run there")
    target = model or started.model
    for what, path in (("model", target), ("draft model", started.draft_model)):
        if not path or not Path(path).is_file():
            raise RecordingError(f"the recorded {what} {path!r} is not a file here (pass --model for the target)")
    shapes = check_shapes(advice)
    width = max(int((run_knobs(s.shape, advice.run_strategy) or {}).get("tree_width", 1)) for s in shapes)
    threads = next((e.n_threads for e in events if isinstance(e, Verified) and e.n_threads), None)
    n_tokens = max_tokens or started.max_tokens
    runs: list[list[tuple[float, float, float, int, int]]] = [[] for _ in shapes]
    before = load_average()
    with Session(
        target,
        n_ctx=started.n_ctx or 4096,
        n_batch=started.n_batch or 512,
        n_ubatch=started.n_ubatch or 512,
        n_threads=threads,
        prefill=started.prefill,
        n_seq_max=width,
    ) as s:
        for _ in range(repeats):
            for i, scored in enumerate(shapes):
                runs[i].append(_run_one(s, started, scored.shape, n_tokens, advice.run_strategy))
    after = load_average()
    rows = tuple(_row(scored, advice.run_strategy, got) for scored, got in zip(shapes, runs))
    return TreeCheck(rows, n_tokens, repeats, str(target), str(started.draft_model), (before, after))


def _run_one(
    s: Any, started: SessionStarted, shape: Shape, max_tokens: int, strategy: str
) -> tuple[float, float, float, int, int]:
    """One generation of ``shape``: its accepted length, tokens/s, verify rows per drafting round, drafting
    rounds and rounds that branched."""
    knobs = run_knobs(shape, strategy)
    extra: dict[str, Any] = {} if knobs is None else {**knobs, "draft_model": started.draft_model}
    s.start(
        list(started.prompt_tokens),
        max_tokens,
        "none" if knobs is None else strategy,
        temperature=started.temperature,
        top_k=started.top_k,
        top_p=started.top_p,
        seed=started.seed,
        stop=list(started.stop) or None,
        **extra,
    )
    s.run()
    t = s.telemetry_dict()
    rows = [e.batch_size for e in s.events if isinstance(e, Verified) and e.batch_size > 1]
    per_round = statistics.fmean(rows) if rows else 1.0
    return t["mean_accepted_length"], t["tokens_per_second"], per_round, len(rows), t["tree"]["rounds_with_branches"]


def _row(scored: Scored, strategy: str, got: list[tuple[float, float, float, int, int]]) -> CheckedShape:
    return CheckedShape(
        shape=scored.shape,
        knobs=run_knobs(scored.shape, strategy) or {},
        predicted_accepted_length=scored.accepted_length,
        predicted_tokens_per_second=scored.tokens_per_second,
        accepted_length=statistics.median(g[0] for g in got),
        tokens_per_second=statistics.median(g[1] for g in got),
        rows_per_round=statistics.median(g[2] for g in got),
        rounds=int(statistics.median(g[3] for g in got)),
        branched=int(statistics.median(g[4] for g in got)),
    )
