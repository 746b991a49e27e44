"""Would a draft tree pay: ``specviz advise REC --tree``, predicted from a linear (chain) recording.

A drafter with a distribution records its own top candidates at each drafted position
(``DraftProposed.alternatives``, :data:`~specviz.strategies.base.DRAFT_ALTERNATIVES` of them). At each depth
the chain's target tested (every drafted position up to and including the first refused one; a depth after
the first refusal was never tested), the target's pick (``Verified.tokens``: the accepted draft token, or the
target's correction at the refusal) was the draft's rank 1 (accepted), 2, 3, … candidate, or none of them:
:func:`rank_shares` counts it (llama.cpp PR #28110's measurement, for every rank).

A tree *shape* is a number of branches per depth (:class:`Shape`): ``2x1x1`` verifies the draft's two best
candidates at depth 1 and a chain of two under each (six nodes; llama.cpp ``examples/speculative`` splitting
into two branches at the first position), ``4x2x1`` SGLang's top-k per node narrowing with depth. Its nodes
are verified in one batch, one row each, beside the pending token's row.

The prediction rests on one **independence assumption**: at depth ``d`` the target's pick is among the
draft's top ``w`` candidates with the share the chain measured at depth ``d`` (among the chain's rounds that
reached ``d``), whichever branch the tree followed to get there and whatever happened above it; in
particular, below a pick the draft caught only at rank 2 or lower, the draft does as well as the chain did
below an accepted rank-1 pick. The probability of reaching depth ``d + 1`` is then the product of the caught
shares of depths ``1 … d``, and a shape's expected accepted length (tokens per round, the target's own
included) is ``1 + sum over d of prod_(i <= d) caught_i(w_i)`` (:func:`accepted_length`). A chain
(``1x1x…``) is scored by the same rule, so chain and tree are compared on equal terms.

What a round costs (:class:`TreeCosts`): the verify of ``1 + nodes`` rows from the verify-cost curve
(:func:`~specviz.analysis.advise_costs.round_costs`: measured, recorded or fitted), the round's fitted
overhead, and drafting: one draft decode per depth, of as many rows as the tree holds nodes at the depth
above (the pending token's one row for depth 1). A draft decode of one row costs what the recording's draft
decodes cost on average; of ``b`` rows, that times the verify curve's ``cost(b) / cost(1)`` (the draft's own
batch curve is not measured; the same kernels make it grow alike). A block drafter (DFlash, DSpark) drafts every
position's candidates in one pass whatever the shape: its rounds' mean draft seconds, once per round. Its
positions are drafted in parallel, so the independence assumption is nearer the truth there (DSpark's positions
lean on the previous position's greedy token only).

The shapes searched (:func:`shapes`): widths from 1 to the recorded candidates, never widening with depth,
as deep as the recording's depths hold :data:`MIN_REACHED` rounds (at most :data:`MAX_DEPTH`), at most
:data:`NODE_BUDGET` nodes (SGLang's ``speculative_num_draft_tokens``). The best chain (plain decoding
included) is the baseline; a tree pays where its expected tokens/s beats it by :data:`PAYS_MARGIN`. Where
none does, :func:`needed_ratio` finds how cheap extra rows would have to be: the largest ratio of a
``NODE_BUDGET + 1``-row verify to a 1-row verify (on a straight-line curve through this machine's 1-row cost)
at which the best tree still pays — a GPU's regime, where a few more rows cost almost nothing.

Running a shape (:func:`run_knobs`): the ``draft`` strategy drafts trees as llama.cpp's ``examples/speculative``
does, in its knobs ``tree_width`` (the most branches), ``p_split`` (a branch splits where the draft's next-ranked
candidate is above it) and ``draft_max`` (the tree's node budget). With ``p_split`` 0 a node splits while branches
are free, so the root takes the draft's top ``W`` candidates and each drafts a chain below it: ``tree_width W,
p_split 0, draft_max W x depth`` drafts the shape ``Wx1x…x1`` exactly (with ``draft_p_min`` 0 and alignment
off, so no draft stops early nor is cut to a tile). Shapes that branch below the first depth (``2x2x1``) have no
knob: the draft strategy branches there only where its ``p_split`` rule finds the draft unsure, so its shape
varies round by round. SGLang's settings (top-k per node, depth, a budget of verified nodes) describe another
family: the top-k of each kept node expanded at every depth, then the budget's most probable nodes kept. The
advice names the best shape of all and the best the draft strategy runs (:attr:`TreeAdvice.runnable`); ``specviz
advise REC --tree --check`` runs it (:mod:`specviz.analysis.tree_check`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from ..decoding.events import DraftProposed, Event, SessionStarted, Verified
from ..decoding.verify_cost import VerifyCostModel
from ..errors import RecordingError
from .advise_costs import round_costs, scaled_to_times
from .advise_rounds import collect
from .sources import EventSource, events_of

#: Rounds a depth needs before shapes reach it: below it one round moves a share by several percent.
MIN_REACHED = 10
#: The deepest shape searched (the chain recordings this reads rarely reach past 8 tokens).
MAX_DEPTH = 8
#: The most nodes a shape verifies (SGLang's ``speculative_num_draft_tokens`` is 8 by default; 16 leaves room).
NODE_BUDGET = 16
#: How much a tree's predicted tokens/s must beat the best chain's: a prediction from shares measured over
#: a few hundred rounds and an assumption of independence is not worth a smaller gain.
PAYS_MARGIN = 1.02
#: The verify-cost ratio search's precision (relative), and the largest ratio it tries.
_RATIO_STEPS = 40
_RATIO_CEILING = 1e3


@dataclass(frozen=True)
class RankShares:
    """Per depth (0 = the first drafted position), how many of the chain's rounds reached it (``reached``)
    and how many of those had the target's pick at the draft's rank 1 … k or outside its top k
    (``counts[d]``, k + 1 entries). ``draft_decodes`` and ``draft_seconds`` are the recording's draft decodes
    and their seconds (for a draft decode's cost); ``accepted_length`` the recorded rounds' own mean
    accepted length (the target's token included); ``sampled`` whether the recording sampled; ``p_min_stops``
    the drafts that stopped at ``draft_p_min``; ``block_rounds`` the rounds drafted as one block (DFlash,
    DSpark)."""

    strategy: str
    k: int
    reached: tuple[int, ...]
    counts: tuple[tuple[int, ...], ...]
    rounds: int
    draft_decodes: int
    draft_seconds: float
    accepted_length: float
    sampled: bool = False
    p_min_stops: int = 0
    block_rounds: int = 0

    def share(self, depth: int) -> tuple[float, ...]:
        """The shares of rank 1 … k and outside at ``depth`` (zeros where no round reached it)."""
        n = self.reached[depth]
        return tuple(c / n if n else 0.0 for c in self.counts[depth])

    def caught(self, depth: int, width: int) -> float:
        """The share of picks at ``depth`` among the draft's top ``width`` candidates."""
        return sum(self.share(depth)[:width])

    @property
    def usable_depths(self) -> int:
        """The leading depths with at least :data:`MIN_REACHED` rounds (at most :data:`MAX_DEPTH`)."""
        n = 0
        while n < min(len(self.reached), MAX_DEPTH) and self.reached[n] >= MIN_REACHED:
            n += 1
        return n

    @property
    def draft_decode_seconds(self) -> float:
        """A one-row draft decode's mean seconds in the recording."""
        return self.draft_seconds / self.draft_decodes if self.draft_decodes else 0.0


def rank_shares(source: EventSource) -> RankShares:
    """Count the target's picks by the draft's rank at each depth (see the module docstring), over the
    rounds whose draft recorded its candidates; :class:`~specviz.errors.RecordingError` where none did."""
    events = events_of(source)
    pairs = list(_drafts_with_verdicts(events))
    if not pairs:
        raise RecordingError(
            "the recording holds no draft candidates (DraftProposed.alternatives): only a drafter with a model "
            "of its own (draft, eagle3, mtp, dflash, dspark) records them; record a run with --draft-model "
            "DRAFT.gguf (a draft derived with `specviz derive-draft` will do), ideally with --spec-draft-p-min 0"
        )
    k = max(len(a) for d, _ in pairs for a in d.alternatives)
    counts: list[list[int]] = []
    names: list[str] = []
    decodes, seconds, accepted = 0, 0.0, 0
    for d, v in pairs:
        n_accepted = len(v.tokens) - 1
        accepted += min(n_accepted, len(d.tokens))
        decodes += len(d.tokens) + (d.reason == "p-min")  # a p-min stop decoded the row it refused
        seconds += float(d.seconds)
        if d.drafter and d.drafter not in names:
            names.append(d.drafter)
        for depth in range(min(n_accepted + 1, len(d.tokens))):
            if depth == len(counts):
                counts.append([0] * (k + 1))
            cands = [int(t) for t in d.alternatives[depth]]
            pick = int(v.tokens[depth])
            counts[depth][cands.index(pick) if pick in cands else k] += 1
    return RankShares(
        strategy=", ".join(names) or "draft",
        k=k,
        reached=tuple(sum(c) for c in counts),
        counts=tuple(tuple(c) for c in counts),
        rounds=len(pairs),
        draft_decodes=decodes,
        draft_seconds=seconds,
        accepted_length=1.0 + accepted / len(pairs),
        sampled=any(isinstance(e, SessionStarted) and e.temperature > 0 for e in events),
        p_min_stops=sum(d.reason == "p-min" for d, _ in pairs),
        block_rounds=sum(d.block is not None for d, _ in pairs),
    )


def _drafts_with_verdicts(events: Sequence[Event]) -> Iterator[tuple[DraftProposed, Verified]]:
    """Each drafted round that recorded candidates, with its verdict."""
    pending: DraftProposed | None = None
    for e in events:
        if isinstance(e, DraftProposed):
            pending = e if e.tokens and len(e.alternatives) == len(e.tokens) else None
        elif isinstance(e, Verified) and pending is not None and e.round == pending.round:
            yield pending, e
            pending = None


@dataclass(frozen=True)
class Shape:
    """A tree as the draft's candidates kept per depth: ``widths[d]`` children under every node of depth
    ``d - 1`` (the pending token for ``d = 0``). All ones: a chain; empty: plain decoding."""

    widths: tuple[int, ...]

    @property
    def per_depth(self) -> tuple[int, ...]:
        """Nodes at each depth."""
        out, n = [], 1
        for w in self.widths:
            n *= w
            out.append(n)
        return tuple(out)

    @property
    def nodes(self) -> int:
        """Draft nodes verified (one row each)."""
        return sum(self.per_depth)

    @property
    def is_chain(self) -> bool:
        """No depth branches."""
        return all(w == 1 for w in self.widths)

    @property
    def label(self) -> str:
        """``tree 2x1x1``; ``chain of 3``; ``plain``."""
        if not self.widths:
            return "plain"
        return f"chain of {len(self.widths)}" if self.is_chain else "tree " + "x".join(map(str, self.widths))


#: The strategy whose knobs draft a tree shape (see the module docstring).
TREE_STRATEGY = "draft"


def run_knobs(shape: Shape, strategy: str = TREE_STRATEGY) -> dict[str, Any] | None:
    """The knobs that draft ``shape`` every round on ``strategy``: a chain's length (any drafter), or for the
    ``draft`` strategy a tree ``Wx1x…x1`` (``tree_width`` W, ``p_split`` 0, ``draft_max`` its nodes); with
    ``draft_p_min`` 0 and alignment off, so each round drafts the whole shape. None for plain decoding, for a shape
    that branches below the first depth, and for a tree on another strategy (no knob drafts it)."""
    if not shape.widths:
        return None
    base: dict[str, Any] = {"draft_max": shape.nodes, "draft_p_min": 0.0, "align": False, "draft_policy": "fixed"}
    if shape.is_chain:
        return base
    if strategy != TREE_STRATEGY or any(w != 1 for w in shape.widths[1:]):
        return None
    return {**base, "tree_width": shape.widths[0], "p_split": 0.0}


def run_flags(knobs: dict[str, Any]) -> str:
    """``knobs`` (from :func:`run_knobs`) as ``specviz run`` options, in llama.cpp's spelling where it has one."""
    out = [f"--spec-draft-n-max {knobs['draft_max']}", f"--spec-draft-p-min {knobs['draft_p_min']:g}"]
    if "tree_width" in knobs:
        out += [f"--tree-width {knobs['tree_width']}", f"--spec-draft-p-split {knobs['p_split']:g}"]
    return " ".join([*out, "--align false"])


def accepted_length(shares: RankShares, shape: Shape) -> float:
    """The expected tokens a round of ``shape`` commits (the target's own included), under the module's
    independence assumption: ``1 + sum_d prod_(i <= d) caught_i(widths[i])``."""
    total, reach = 1.0, 1.0
    for depth, w in enumerate(shape.widths):
        reach *= shares.caught(depth, w)
        total += reach
    return total


def shapes(k: int, depths: int, budget: int = NODE_BUDGET) -> list[Shape]:
    """Every shape of widths 1 … ``k``, never widening with depth, 1 … ``depths`` deep, with at most ``budget``
    nodes; plain decoding first."""
    out = [Shape(())]

    def grow(widths: tuple[int, ...], nodes: int, last: int) -> None:
        if widths:
            out.append(Shape(widths))
        if len(widths) == depths:
            return
        level = Shape(widths).per_depth[-1] if widths else 1
        for w in range(1, last + 1):
            if nodes + level * w <= budget:
                grow((*widths, w), nodes + level * w, w)

    grow((), 0, k)
    return out


@dataclass(frozen=True)
class TreeCosts:
    """What a round of a shape costs (see the module docstring): ``verify(b)`` seconds for ``b`` rows, the
    overhead ``a + b * rows read``, and a one-row draft decode's seconds; ``block``, a block drafter's one
    pass (DFlash, DSpark: every position's candidates at once, whatever the shape), None for a chain drafter."""

    verify: Callable[[int], float]
    overhead: tuple[float, float]
    draft_decode: float
    block: float | None = None

    def round_seconds(self, shape: Shape, accepted: float) -> float:
        """A round of ``shape`` committing ``accepted`` tokens on average (the rows its acceptor reads)."""
        if not shape.widths:
            drafting = 0.0
        elif self.block is not None:
            drafting = self.block
        else:  # one draft decode per depth, of the nodes of the depth above (the pending token's row first)
            one = self.verify(1)
            drafting = sum(self.draft_decode * self.verify(n) / one for n in (1, *shape.per_depth[:-1]))
        return drafting + self.verify(1 + shape.nodes) + self.overhead[0] + self.overhead[1] * accepted


@dataclass(frozen=True)
class Scored:
    """A shape's prediction: accepted length, round seconds and tokens/s."""

    shape: Shape
    accepted_length: float
    round_seconds: float

    @property
    def tokens_per_second(self) -> float:
        """Expected tokens per second."""
        return self.accepted_length / self.round_seconds if self.round_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "shape": self.shape.label,
            "widths": list(self.shape.widths),
            "nodes": self.shape.nodes,
            "rows": 1 + self.shape.nodes,
            "predicted_accepted_length": self.accepted_length,
            "round_seconds": self.round_seconds,
            "tokens_per_second": self.tokens_per_second,
        }


def score_all(shares: RankShares, costs: TreeCosts, grid: Sequence[Shape]) -> list[Scored]:
    """Every shape of ``grid`` scored under ``costs``."""
    out = []
    for s in grid:
        n = accepted_length(shares, s)
        out.append(Scored(s, n, costs.round_seconds(s, n)))
    return out


def best_pair(scored: Sequence[Scored]) -> tuple[Scored, Scored | None]:
    """The best chain (plain decoding included) and the best tree (None when the grid holds none)."""
    chain = max((s for s in scored if s.shape.is_chain), key=lambda s: s.tokens_per_second)
    trees = [s for s in scored if not s.shape.is_chain]
    return chain, (max(trees, key=lambda s: s.tokens_per_second) if trees else None)


def extended(curve: VerifyCostModel) -> tuple[Callable[[int], float], int]:
    """``curve`` as a tree prices its rows, and the most rows it measured: beyond them, the measured cost of the
    most rows plus the curve's mean cost per row from one row to there (never negative). A curve measured up to
    a chain's longest draft would otherwise extend its last segment, whose slope is noise or a verify tile's
    step (on the embedded model an 8-row verify measured cheaper than a 7-row one), to 17 rows."""
    last = int(curve.sizes[-1])
    top = curve(last)
    slope = max((top - curve(1)) / (last - 1), 0.0) if last > 1 else 0.0
    return (lambda b: curve(b) if b <= last else top + slope * (b - last)), last


def linear_curve(one_row: float, ratio: float, rows: int = NODE_BUDGET + 1) -> Callable[[int], float]:
    """A verify cost through ``one_row`` seconds for one row, ``ratio`` times that for ``rows`` rows, linear."""
    return lambda b: one_row * (1.0 + (ratio - 1.0) * (b - 1) / (rows - 1))


def _pays_at(shares: RankShares, costs: TreeCosts, grid: Sequence[Shape], ratio: float) -> bool:
    """Whether the best tree beats the best chain by :data:`PAYS_MARGIN` on a straight-line curve of ``ratio``."""
    hypothetical = TreeCosts(linear_curve(costs.verify(1), ratio), costs.overhead, costs.draft_decode, costs.block)
    chain, tree = best_pair(score_all(shares, hypothetical, grid))
    return tree is not None and tree.tokens_per_second > chain.tokens_per_second * PAYS_MARGIN


def needed_ratio(shares: RankShares, costs: TreeCosts, grid: Sequence[Shape]) -> float | None:
    """The largest ratio of a ``NODE_BUDGET + 1``-row verify to a 1-row verify (straight-line curve, this
    machine's 1-row cost, draft and overhead) at which a tree pays; None where none pays even with free rows."""
    if not _pays_at(shares, costs, grid, 1.0):
        return None
    lo, hi = 1.0, 2.0
    while _pays_at(shares, costs, grid, hi) and hi < _RATIO_CEILING:
        lo, hi = hi, hi * 2
    for _ in range(_RATIO_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _pays_at(shares, costs, grid, mid) else (lo, mid)
    return lo


@dataclass(frozen=True)
class TreeAdvice:
    """Whether a draft tree would pay on this machine (see the module docstring): the rank shares, every shape
    scored, the best chain and the best tree, the verdict (``pays``), this machine's ratio of a
    ``NODE_BUDGET + 1``-row verify to a 1-row verify (``measured_ratio``) and, where no tree pays, the ratio at
    which one would (``needed_ratio``; None where none would even with free rows)."""

    shares: RankShares
    cost_source: str
    scored: tuple[Scored, ...]
    chain: Scored
    tree: Scored | None
    pays: bool
    measured_ratio: float
    needed_ratio: float | None
    one_row_seconds: float = 0.0  #: the verify curve's one-row cost
    draft_decode_seconds: float = 0.0  #: a one-row draft decode as priced (at the curve's level)
    notes: tuple[str, ...] = ()
    #: the best tree the recorded strategy drafts every round with its knobs (:func:`run_knobs`), None where none
    runnable: Scored | None = None

    @property
    def run_strategy(self) -> str:
        """The strategy the shapes' knobs are for: the recording's drafter."""
        return self.shares.strategy

    def how_to_run(self) -> str:
        """Which tree runs, with which options, or why none does."""
        if self.tree is None:
            return ""
        if self.runnable is None:
            return (
                f"no knob of the {self.run_strategy} strategy drafts these shapes: a hidden-state drafter's trees "
                "(tree_topk, tree_depth, tree_nodes) keep each expansion's most probable nodes, a shape of their own "
                "(benchmarks/bench_tree.py --eagle3-head runs them beside the chain)"
            )
        knobs = run_knobs(self.runnable.shape, self.run_strategy)
        assert knobs is not None
        which = "the best tree" if self.runnable is self.tree else "the best tree the draft strategy drafts as shaped"
        return (
            f"{which}, {self.runnable.shape.label} ({self.runnable.tokens_per_second:.1f} tokens/s predicted), "
            f"runs as: {run_flags(knobs)}; `advise REC --tree --check` runs it beside the chain"
        )

    def best_per_nodes(self) -> list[Scored]:
        """The chains, and the best tree of each node count, by node count."""
        best: dict[int, Scored] = {}
        for s in self.scored:
            if not s.shape.is_chain and (
                s.shape.nodes not in best or s.tokens_per_second > best[s.shape.nodes].tokens_per_second
            ):
                best[s.shape.nodes] = s
        chains = [s for s in self.scored if s.shape.is_chain]
        return sorted(chains + list(best.values()), key=lambda s: (s.shape.nodes, not s.shape.is_chain))

    def verdict(self) -> str:
        """The advice in one sentence."""
        base = self.chain.tokens_per_second
        if self.tree is None:
            return (
                f"no tree shape to score: a depth needs {MIN_REACHED} drafting rounds that reached it, and "
                f"{self.shares.reached[0]} reached the first; record a longer run"
            )
        gain = self.tree.tokens_per_second / base - 1 if base else 0.0
        if self.pays:
            return (
                f"a tree pays on this machine: {self.tree.shape.label} ({self.tree.shape.nodes} nodes) predicts "
                f"{self.tree.tokens_per_second:.1f} tokens/s, {gain:+.0%} over the best chain "
                f"({self.chain.shape.label})"
            )
        ratio = f"{self.measured_ratio:.2f}x"
        if self.needed_ratio is None:
            lower = 1.0 - self.shares.caught(0, 1) - self.shares.share(0)[-1]
            draft_ms, verify_ms = self.draft_decode_seconds * 1e3, self.one_row_seconds * 1e3
            if draft_ms >= verify_ms and self.shares.block_rounds < self.shares.rounds:
                return (
                    f"no tree pays, even where extra verify rows cost nothing: a one-row draft decode ({draft_ms:.1f} "
                    f"ms) costs as much as the target's one-row verify ({verify_ms:.1f} ms), and a tree needs one "
                    f"per depth, of several rows below a branch; a cheaper draft comes first (its rank 2 to "
                    f"{self.shares.k} candidates catch {lower:.0%} of the target's picks at depth 1)"
                )
            return (
                f"no tree pays, even where extra verify rows cost nothing: the draft's rank 2 to {self.shares.k} "
                f"candidates catch {lower:.0%} of the target's picks at depth 1, too few to pay for what a tree adds "
                f"(this machine's {NODE_BUDGET + 1}-row verify costs {ratio} a 1-row one)"
            )
        head = (
            f"no tree pays on this machine: the best tree ({self.tree.shape.label}, {gain:+.0%}) loses to the best "
            f"chain ({self.chain.shape.label}); it would pay where a {NODE_BUDGET + 1}-row verify costs at most "
            f"{self.needed_ratio:.2f}x a 1-row verify"
        )
        if self.needed_ratio < self.measured_ratio:
            return f"{head} (a GPU's regime; this machine: {ratio})"
        # the ratio is found on a straight-line curve; a measured one can step (verify tiles) in between
        return f"{head} on a straight-line curve: this machine's is {ratio}, but dearer in between (a tile's steps)"

    def report(self) -> str:
        """The rank shares, the shapes and the verdict, as text."""
        sh = self.shares
        ranks = [f"rank {r}" for r in range(1, sh.k + 1)]
        lines = [
            f"draft trees for {sh.strategy}, from {sh.rounds} drafting rounds (the draft's top {sh.k} recorded at "
            f"each position; {sh.accepted_length:.2f} tokens per round recorded):",
            "  depth  reached  " + "  ".join(f"{r:>7}" for r in [*ranks, "outside"]),
        ]
        for d in range(len(sh.reached)):
            cells = "  ".join(f"{x:>7.1%}" for x in sh.share(d))
            lines.append(f"  {d + 1:>5}  {sh.reached[d]:>7}  {cells}")
        lines.append(
            f"verify cost {self.cost_source}; a {NODE_BUDGET + 1}-row verify costs {self.measured_ratio:.2f}x a "
            f"1-row verify here; a one-row draft decode {self.draft_decode_seconds * 1e3:.2f} ms"
        )
        lines.append(f"  {'shape':<20}  {'nodes':>5}  {'accepted':>8}  {'round ms':>8}  {'tokens/s':>8}")
        for s in self.best_per_nodes():
            mark = " <" if s is self.tree or s is self.chain else ""
            lines.append(
                f"  {s.shape.label:<20}  {s.shape.nodes:>5}  {s.accepted_length:>8.2f}  "
                f"{s.round_seconds * 1e3:>8.2f}  {s.tokens_per_second:>8.1f}{mark}"
            )
        lines.append(self.verdict())
        if self.how_to_run():
            lines.append(self.how_to_run())
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _runnable_dict(self) -> dict[str, Any] | None:
        """The runnable tree's scores, knobs and options (None where none runs)."""
        if self.runnable is None:
            return None
        knobs = run_knobs(self.runnable.shape, self.run_strategy)
        assert knobs is not None
        return {**self.runnable.to_dict(), "strategy": self.run_strategy, "knobs": knobs, "flags": run_flags(knobs)}

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form: ``rank_share`` (per depth: rank 1 … k, then outside),
        ``predicted_accepted_length`` (the best tree's), ``pays``, the shapes and the ratios."""
        sh = self.shares
        return {
            "strategy": sh.strategy,
            "candidates": sh.k,
            "rounds": sh.rounds,
            "reached": list(sh.reached),
            "rank_share": [list(sh.share(d)) for d in range(len(sh.reached))],
            "recorded_accepted_length": sh.accepted_length,
            "predicted_accepted_length": self.tree.accepted_length if self.tree else None,
            "pays": self.pays,
            "best_tree": self.tree.to_dict() if self.tree else None,
            "best_chain": self.chain.to_dict(),
            "shapes": [s.to_dict() for s in self.best_per_nodes()],
            "runnable_tree": self._runnable_dict(),
            "verify_cost": {
                "source": self.cost_source,
                "ratio_rows": NODE_BUDGET + 1,
                "measured_ratio": self.measured_ratio,
                "one_row_seconds": self.one_row_seconds,
                "needed_ratio": self.needed_ratio,
            },
            "draft_decode_seconds": self.draft_decode_seconds,
            "verdict": self.verdict(),
            "notes": list(self.notes),
        }


def tree_advice(source: EventSource, cost: VerifyCostModel | None = None) -> TreeAdvice:
    """Would a tree pay, from a chain recording (see the module docstring). ``cost``: a measured verify-cost
    curve; without it the one recorded in the telemetry, or one fitted to the recorded verify times.
    :class:`~specviz.errors.RecordingError` where the recording holds no draft candidates or no curve."""
    events = events_of(source)
    shares = rank_shares(events)
    rec = collect(events)
    got = round_costs(rec, cost)
    if got is None:
        raise RecordingError(
            "the recording has verify times of fewer than two batch sizes, too few for a verify-cost curve: pass "
            "--verify-cost FILE.json (benchmarks/bench_verify_cost.py --json) or --fresh"
        )
    curve, source_name, overhead, _ = got
    # a curve measured apart from the rounds (--fresh, --verify-cost) is at its own machine's level: the
    # recorded draft decodes are moved to it by the recorded verify times' level over the curve's
    level = scaled_to_times(curve, rec.verify)[1] if cost is not None else 1.0
    level = level if level > 0 else 1.0  # recorded verifies of no time (built rounds) say nothing of the level
    verify, measured_rows = extended(curve)
    fitted = sorted(rec.verify) if source_name.startswith("fitted") else []
    block = shares.draft_seconds / shares.rounds / level if shares.block_rounds == shares.rounds else None
    costs = TreeCosts(verify, overhead, shares.draft_decode_seconds / level, block)
    grid = shapes(shares.k, shares.usable_depths)
    scored = score_all(shares, costs, grid)
    chain, tree = best_pair(scored)
    trees = [s for s in scored if not s.shape.is_chain and run_knobs(s.shape, shares.strategy) is not None]
    pays = tree is not None and tree.tokens_per_second > chain.tokens_per_second * PAYS_MARGIN
    return TreeAdvice(
        shares=shares,
        cost_source=source_name,
        scored=tuple(scored),
        chain=chain,
        tree=tree,
        pays=pays,
        measured_ratio=verify(NODE_BUDGET + 1) / verify(1),
        one_row_seconds=verify(1),
        draft_decode_seconds=costs.draft_decode,
        needed_ratio=None if pays else needed_ratio(shares, costs, grid),
        notes=tuple(_notes(shares, measured_rows, max(1 + s.nodes for s in grid), level, fitted)),
        runnable=max(trees, key=lambda s: s.tokens_per_second) if trees else None,
    )


def _notes(shares: RankShares, measured_rows: int, rows_needed: int, level: float, fitted: list[int]) -> list[str]:
    """What limits the prediction: the assumption, the depths, sampling, the curve's reach (``fitted``: the
    batch sizes a curve fitted to the recorded verify times rests on), the draft decodes' level, p_min stops."""
    out = [
        "a prediction from the chain's rank shares, assuming each depth's share holds whichever branch reached it; "
        "--check measures it"
    ]
    if shares.usable_depths < len(shares.reached):
        out.append(
            f"shapes reach {shares.usable_depths} deep: deeper depths were reached by fewer than {MIN_REACHED} rounds"
        )
    if shares.sampled:
        out.append(
            "the recording sampled: the ranks are those of the committed tokens, and a sampled tree verifies with "
            "multi-draft rejection sampling, whose acceptance this greedy rule only approximates"
        )
    if fitted and fitted[-1] < rows_needed:
        out.append(
            f"the verify-cost curve is fitted to the recorded verify times of {len(fitted)} batch sizes "
            f"({', '.join(map(str, fitted))} rows): the shapes' wider batches (up to {rows_needed} rows) are its "
            "straight line's guess; --fresh measures them"
        )
    elif measured_rows < rows_needed:
        out.append(
            f"the verify-cost curve reaches {measured_rows} rows; the shapes' {rows_needed} are priced on its mean "
            "cost per row beyond that (--fresh measures up to the shapes' rows)"
        )
    if abs(level - 1.0) > 0.05:
        out.append(
            f"the recorded verify times are {level:.2f}x the curve's: the recorded draft decodes "
            f"({shares.draft_decode_seconds * 1e3:.2f} ms) are priced at the curve's level, {level:.2f}x less"
        )
    if shares.p_min_stops:
        out.append(
            f"{shares.p_min_stops} drafts stopped where the draft was unsure (draft_p_min): the deeper depths are "
            "measured on its confident rounds only; a recording with --spec-draft-p-min 0 measures every depth"
        )
    return out
