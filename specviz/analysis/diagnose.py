"""Why is acceptance low? Figures and findings computed from a session's events (live or recorded).

Everything here reads events only (:mod:`specviz.decoding.events`), so a recording made anywhere can be diagnosed
without the model: ``specviz diagnose RECORDING.jsonl``. Rewinds are honoured (the events a rewind
dropped are left out, :func:`specviz.decoding.rewind.effective_events`).

Terms. A draft token is *examined* when the target judged it: every token up to and including the first
rejected one of its draft (the tokens after a rejection were never tested, so they count in no rate
here; the telemetry's acceptance rate counts them as not accepted). *Acceptance* below is accepted over
examined.

Per rejection (:class:`RejectionRow`): the round, the history position, the draft depth, the drafted
token and the drafter's own probability of it, the target's probability and rank of that token (1 = the
target's own choice), the target's top-two logit margin there, and the token the target chose instead.

Aggregates (:class:`Diagnosis`): acceptance by token class (:func:`token_class`), the most frequent
(drafted → chosen) pairs, the near-miss share (rejections whose drafted token was in the target's top
:data:`NEAR_MISS_K`), acceptance inside copied spans and elsewhere (a position is inside a copied span
when the :data:`COPY_NGRAM` tokens of the output ending there occur earlier in the prompt or output),
acceptance by draft depth and by the drafter's own probability (0.1-wide buckets).

Findings are short sentences derived from those numbers; each names the threshold it used.
"""

from __future__ import annotations

import re
import statistics
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from .sources import EventSource, events_of

#: A rejection is a near miss when the drafted token was among the target's top this many.
NEAR_MISS_K = 5
#: A position is inside a copied span when the n-gram of this many output tokens ending there occurred before.
COPY_NGRAM = 4
#: Findings are made from groups of at least this many examined tokens (or rejections).
MIN_SUPPORT = 8
#: Acceptance below which a deeper draft position costs more than it returns, unless a verify cost curve
#: gives the break-even (one extra token's marginal verify cost over a one-token decode's cost).
BREAK_EVEN = 0.4
#: Acceptance below which low-confidence drafts are worth cutting with draft_p_min.
LOW_CONFIDENCE_ACCEPTANCE = 0.25
#: Token classes, in display order.
TOKEN_CLASSES = ("whitespace", "punctuation", "digits", "word start", "word continuation", "special", "other")
#: How many (drafted → chosen) pairs and rejection rows :meth:`Diagnosis.to_dict` lists.
TOP_PAIRS = 10
MAX_ROWS = 400

_SPECIAL = re.compile(r"^(<\|?[^<>\s][^<>]*\|?>|\[[A-Z_]+\])$")


def token_class(piece: str) -> str:
    """The class of a token from its text: ``whitespace`` (spaces, tabs, newlines: formatting),
    ``punctuation`` (punctuation and symbols), ``digits``, ``word start`` (letters after a leading
    space), ``word continuation`` (letters without one), ``special`` (``<eos>``, ``<|im_end|>`` …) or
    ``other`` (mixed, partial UTF-8 …)."""
    if piece is None or piece == "":
        return "other"
    piece = piece.replace("▁", " ")  # SentencePiece's word-start mark, where a vocabulary shows it
    core = piece.strip()
    if core == "":
        return "whitespace"
    if _SPECIAL.match(core) and len(core) > 2:
        return "special"
    if all(c.isdigit() or c in ",." for c in core) and any(c.isdigit() for c in core):
        return "digits"
    if all(unicodedata.category(c)[0] in "PS" for c in core):
        return "punctuation"
    if any(c.isalpha() for c in core) and all(c.isalnum() or c in "'-_" for c in core):
        return "word start" if piece[0].isspace() else "word continuation"
    return "other"


@dataclass(frozen=True)
class RejectionRow:
    """One rejection: where, which tokens, and what the target and the drafter thought of them."""

    round: int
    position: int
    depth: int
    drafted: int
    drafted_piece: str
    draft_prob: float | None
    target_prob: float | None  #: the target's probability of the drafted token
    target_rank: int | None  #: its rank among the target's choices (1 = the target's own)
    margin: float | None  #: the target's top-two logit margin there
    chosen: int
    chosen_piece: str
    chosen_prob: float
    token_class: str
    copied: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class Examined:
    """One examined draft token: round, depth, its class, the drafter's probability, inside a copied span,
    accepted."""

    round: int
    depth: int
    token_class: str
    draft_prob: float | None
    copied: bool
    accepted: bool
    strategy: str


def _rate(hits: int, tries: int) -> float | None:
    return hits / tries if tries else None


def _group(rows: Iterable[Examined], key) -> dict[Any, dict[str, Any]]:
    out: dict[Any, list[int]] = {}
    for r in rows:
        k = key(r)
        if k is None:
            continue
        h = out.setdefault(k, [0, 0])
        h[0] += 1
        h[1] += int(r.accepted)
    return {k: {"examined": t, "accepted": a, "acceptance": _rate(a, t)} for k, (t, a) in out.items()}


@dataclass
class Diagnosis:
    """Figures and findings of one session (see the module docstring); :meth:`to_dict` for JSON."""

    rounds: int = 0
    drafting_rounds: int = 0
    drafted: int = 0
    examined: int = 0
    accepted: int = 0
    strategies: list[str] = field(default_factory=list)
    knobs: dict[str, Any] = field(default_factory=dict)
    empty_reasons: dict[str, int] = field(default_factory=dict)
    tokens: list[Examined] = field(default_factory=list)
    rejections: list[RejectionRow] = field(default_factory=list)
    break_even: float = BREAK_EVEN
    break_even_source: str = "default"

    # -- aggregates ------------------------------------------------------------------------------
    @property
    def acceptance(self) -> float | None:
        """Accepted over examined draft tokens."""
        return _rate(self.accepted, self.examined)

    def by_class(self) -> dict[str, dict[str, Any]]:
        """Acceptance by token class of the drafted token."""
        g = _group(self.tokens, lambda r: r.token_class)
        return {c: g[c] for c in TOKEN_CLASSES if c in g}

    def by_depth(self) -> list[dict[str, Any]]:
        """Acceptance by draft depth (0-based), given the target reached that depth."""
        g = _group(self.tokens, lambda r: r.depth)
        return [{"depth": d, **g[d]} for d in sorted(g)]

    def by_confidence(self) -> list[dict[str, Any]]:
        """Acceptance by the drafter's own probability, in buckets ``[lo, lo + 0.1)``."""
        g = _group(self.tokens, lambda r: None if r.draft_prob is None else min(int(r.draft_prob * 10), 9))
        return [{"lo": b / 10, "hi": (b + 1) / 10, **g[b]} for b in sorted(g)]

    def copied(self) -> dict[str, dict[str, Any]]:
        """Acceptance inside copied spans and elsewhere."""
        g = _group(self.tokens, lambda r: "inside copied spans" if r.copied else "elsewhere")
        return {k: g[k] for k in ("inside copied spans", "elsewhere") if k in g}

    def near_miss_share(self, k: int = NEAR_MISS_K) -> float | None:
        """Share of rejections whose drafted token was among the target's top ``k``."""
        ranks = [r.target_rank for r in self.rejections if r.target_rank is not None]
        return _rate(sum(1 for x in ranks if x <= k), len(ranks)) if ranks else None

    def top_pairs(self, n: int = TOP_PAIRS) -> list[dict[str, Any]]:
        """The most frequent (drafted → chosen) pairs at rejections."""
        c = Counter((r.drafted, r.drafted_piece, r.chosen, r.chosen_piece) for r in self.rejections)
        total = len(self.rejections)
        return [
            {"drafted": d, "drafted_piece": dp, "chosen": ch, "chosen_piece": cp, "count": k, "share": k / total}
            for (d, dp, ch, cp), k in c.most_common(n)
        ]

    def medians(self) -> dict[str, float | None]:
        """Median target probability, rank and margin of the drafted token at rejections, and the
        drafter's median probability of it."""

        def med(xs: list[float]) -> float | None:
            return statistics.median(xs) if xs else None

        rej = self.rejections
        return {
            "target_prob": med([r.target_prob for r in rej if r.target_prob is not None]),
            "target_rank": med([float(r.target_rank) for r in rej if r.target_rank is not None]),
            "margin": med([r.margin for r in rej if r.margin is not None]),
            "draft_prob": med([r.draft_prob for r in rej if r.draft_prob is not None]),
        }

    # -- findings --------------------------------------------------------------------------------
    def findings(self) -> list[dict[str, Any]]:
        """Short sentences derived from the figures, each with the threshold it used (``key``, ``text``,
        ``threshold``), most important first."""
        out: list[dict[str, Any]] = []
        if self.examined == 0:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.empty_reasons.items(), key=lambda x: -x[1]))
            text = "no draft token was verified" + (f" (the drafter stopped: {reasons})" if reasons else "")
            return [{"key": "no-drafts", "text": text + ".", "threshold": None}]
        total_rej = len(self.rejections)
        # where drafts stop paying: the first depth whose acceptance falls below the break-even
        depths = self.by_depth()
        be = self.break_even
        cut = next(
            (
                d
                for d in depths
                if d["examined"] >= MIN_SUPPORT
                and d["acceptance"] is not None
                and d["acceptance"] < be
                and d["depth"] > 0
            ),
            None,
        )
        if cut is not None and total_rej:
            late = sum(1 for r in self.rejections if r.depth >= cut["depth"])
            tail = [d for d in depths if d["depth"] >= cut["depth"]]
            t_ex, t_acc = sum(d["examined"] for d in tail), sum(d["accepted"] for d in tail)
            out.append(
                {
                    "key": "depth",
                    "threshold": be,
                    "text": (
                        f"{late / total_rej:.0%} of rejections are at depth {cut['depth'] + 1} and beyond, where "
                        f"{t_acc / t_ex:.0%} of draft tokens are accepted "
                        f"(break-even {be:.0%}, {self.break_even_source}): "
                        f"drafts past {cut['depth']} token{'s' if cut['depth'] != 1 else ''} cost more than they return"
                    ),
                }
            )
        elif depths and depths[0]["examined"] >= MIN_SUPPORT and (depths[0]["acceptance"] or 0) < be:
            out.append(
                {
                    "key": "depth",
                    "threshold": be,
                    "text": (
                        f"the first draft token is accepted only {depths[0]['acceptance']:.0%} of the time (break-even "
                        f"{be:.0%}, {self.break_even_source}): drafting does not pay here at any length"
                    ),
                }
            )
        # draft confidence: the lowest cut below which drafts are mostly rejected
        conf = [(r.draft_prob, r.accepted) for r in self.tokens if r.draft_prob is not None]
        if len(conf) >= MIN_SUPPORT:
            p_min = float(self.knobs.get("draft_p_min", 0.0) or 0.0)
            # the highest cut whose tokens below are mostly rejected, then the lowest cut removing the same tokens
            cands = []
            for t10 in range(1, 10):
                t = t10 / 10
                below = [ok for p, ok in conf if p < t]
                if len(below) >= MIN_SUPPORT:
                    rate = sum(below) / len(below)
                    if rate < LOW_CONFIDENCE_ACCEPTANCE:
                        cands.append((t, rate, len(below)))
            best = None
            if cands:
                top = cands[-1]
                best = next(c for c in cands if c[2] == top[2])
            if best is not None and best[0] > p_min:
                t, rate, n = best
                cuts = "cuts nothing" if not any(p < p_min for p, _ in conf) else "cuts too little"
                out.append(
                    {
                        "key": "confidence",
                        "threshold": LOW_CONFIDENCE_ACCEPTANCE,
                        "text": (
                            f"draft_p_min {p_min:g} {cuts}: drafts below {t:.1f} confidence are accepted {rate:.0%} of "
                            f"the time ({n} tokens; threshold {LOW_CONFIDENCE_ACCEPTANCE:.0%}), so draft_p_min {t:.1f} "
                            "would stop them"
                        ),
                    }
                )
        # near misses
        nm = self.near_miss_share()
        med = self.medians()
        if nm is not None and total_rej >= MIN_SUPPORT:
            if nm >= 0.5:
                margin = f", median top-two margin {med['margin']:.2f}" if med["margin"] is not None else ""
                out.append(
                    {
                        "key": "near-miss",
                        "threshold": 0.5,
                        "text": (
                            f"{nm:.0%} of rejections are near misses (the drafted token was in the target's top "
                            f"{NEAR_MISS_K}{margin}): the drafter guesses the right kind of token and loses close calls"
                        ),
                    }
                )
            elif nm <= 0.2:
                rank = f" (median rank {med['target_rank']:.0f})" if med["target_rank"] is not None else ""
                out.append(
                    {
                        "key": "near-miss",
                        "threshold": 0.2,
                        "text": (
                            f"only {nm:.0%} of rejections are near misses{rank}: the drafted tokens are far from what "
                            "the target wants"
                        ),
                    }
                )
        # copied spans
        cp = self.copied()
        ins, els = cp.get("inside copied spans"), cp.get("elsewhere")
        if ins and els and ins["examined"] >= MIN_SUPPORT and els["examined"] >= MIN_SUPPORT:
            a_in, a_el = ins["acceptance"] or 0.0, els["acceptance"] or 0.0
            if a_in - a_el >= 0.3:
                out.append(
                    {
                        "key": "copied",
                        "threshold": 0.3,
                        "text": (
                            f"acceptance is {a_in:.0%} inside copied spans and {a_el:.0%} elsewhere "
                            "(gap over 30 points): "
                            "the drafter pays where the output copies; draft_policy=cost keeps drafts short elsewhere"
                        ),
                    }
                )
        # token classes well below the rest
        overall = self.acceptance or 0.0
        for cls, g in self.by_class().items():
            if g["examined"] >= MIN_SUPPORT and g["acceptance"] is not None and overall - g["acceptance"] >= 0.25:
                out.append(
                    {
                        "key": "class",
                        "threshold": 0.25,
                        "text": (
                            f"{cls} tokens are accepted {g['acceptance']:.0%} of the time "
                            f"against {overall:.0%} overall "
                            f"({g['examined']} examined; a gap over 25 points)"
                        ),
                    }
                )
        # one pair dominating
        pairs = self.top_pairs(1)
        if pairs and total_rej >= MIN_SUPPORT and pairs[0]["share"] >= 0.1:
            p = pairs[0]
            out.append(
                {
                    "key": "pair",
                    "threshold": 0.1,
                    "text": (
                        f"{_q(p['drafted_piece'])} drafted where the target chose {_q(p['chosen_piece'])} makes "
                        f"{p['share']:.0%} of rejections ({p['count']}; at least 10% to be named)"
                    ),
                }
            )
        # rounds without a draft
        empty = self.rounds - self.drafting_rounds
        if self.rounds >= MIN_SUPPORT and empty / self.rounds >= 0.5:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.empty_reasons.items(), key=lambda x: -x[1])[:3])
            out.append(
                {
                    "key": "no-draft",
                    "threshold": 0.5,
                    "text": (
                        f"{empty / self.rounds:.0%} of rounds proposed no draft ({reasons}): those rounds are plain "
                        "decoding (at least half to be named)"
                    ),
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every figure and finding as one JSON-serialisable dictionary."""
        return {
            "rounds": self.rounds,
            "drafting_rounds": self.drafting_rounds,
            "drafted": self.drafted,
            "examined": self.examined,
            "accepted": self.accepted,
            "acceptance": self.acceptance,
            "rejections": len(self.rejections),
            "strategies": list(self.strategies),
            "by_class": self.by_class(),
            "by_depth": self.by_depth(),
            "by_confidence": self.by_confidence(),
            "copied": self.copied(),
            "near_miss_k": NEAR_MISS_K,
            "near_miss_share": self.near_miss_share(),
            "top_pairs": self.top_pairs(),
            "medians": self.medians(),
            "empty_reasons": dict(self.empty_reasons),
            "break_even": self.break_even,
            "break_even_source": self.break_even_source,
            "findings": self.findings(),
            "rejection_rows": [r.to_dict() for r in self.rejections[-MAX_ROWS:]],
        }

    def text(self) -> str:
        """A plain-text report (what ``specviz diagnose`` prints)."""
        d = self.to_dict()
        lines = [
            f"{self.rounds} rounds, {self.drafting_rounds} with a draft; {self.examined} draft tokens examined, "
            f"{self.accepted} accepted ({_pct(self.acceptance)}), {len(self.rejections)} rejections"
        ]
        lines.append("findings:")
        lines += [f"  - {f['text']}" for f in d["findings"]] or ["  (none)"]
        lines.append("acceptance by token class:")
        lines += [f"  {k:<18} {_pct(v['acceptance']):>5}  of {v['examined']}" for k, v in d["by_class"].items()]
        lines.append("acceptance by draft depth:")
        lines += [f"  depth {r['depth'] + 1:<3} {_pct(r['acceptance']):>5}  of {r['examined']}" for r in d["by_depth"]]
        if d["by_confidence"]:
            lines.append("acceptance by draft confidence:")
            lines += [
                f"  [{r['lo']:.1f}, {r['hi']:.1f})  {_pct(r['acceptance']):>5}  of {r['examined']}"
                for r in d["by_confidence"]
            ]
        lines.append(
            "copied spans: "
            + ", ".join(f"{k} {_pct(v['acceptance'])} of {v['examined']}" for k, v in d["copied"].items())
        )
        if d["near_miss_share"] is not None:
            lines.append(f"near misses (drafted token in the target's top {NEAR_MISS_K}): {_pct(d['near_miss_share'])}")
        if d["top_pairs"]:
            lines.append("most frequent rejections (drafted -> chosen):")
            lines += [f"  {_q(p['drafted_piece'])} -> {_q(p['chosen_piece'])}  x{p['count']}" for p in d["top_pairs"]]
        return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def _q(piece: str) -> str:
    return "“" + str(piece).replace("\n", "↵").replace("\t", "→") + "”"


def _copied_flags(history: Sequence[int], n: int = COPY_NGRAM) -> list[bool]:
    """For each history position q: the n-gram ending at q occurred earlier (ending before q)."""
    flags = [False] * len(history)
    seen: set[tuple[int, ...]] = set()
    for q in range(n - 1, len(history)):
        g = tuple(history[q - n + 1 : q + 1])
        flags[q] = g in seen
        seen.add(g)
    return flags


def diagnose(source: EventSource, *, cost: Any = None) -> Diagnosis:
    """The diagnosis of a :class:`~specviz.decoding.session.Session` (its events) or of a list of events (a
    recording: :func:`specviz.read_events`). ``cost`` (a :class:`~specviz.decoding.policy.VerifyCostModel`, by
    default the session's measured one if any) sets the depth break-even: one extra verified token's cost
    over a one-token decode's."""
    events = events_of(source)
    if cost is None:
        cost = getattr(source, "cost_model", None)
    dg = Diagnosis()
    if cost is not None:
        try:
            one, two = float(cost(1)), float(cost(9))
            if one > 0 and two > one:
                dg.break_even, dg.break_even_source = (two - one) / 8 / one, "from the measured verify cost"
        except Exception:  # a malformed curve: keep the default
            pass
    history: list[int] = []
    rounds: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    strategy = ""
    for ev in events:
        k = ev.kind
        if k == "session_started":
            history = list(ev.prompt_tokens)  # type: ignore[attr-defined]
            rounds, order = {}, []
            strategy = ev.strategy  # type: ignore[attr-defined]
            dg.knobs = dict(ev.knobs)  # type: ignore[attr-defined]
        elif k == "knobs_changed":
            strategy = ev.strategy  # type: ignore[attr-defined]
            dg.knobs = dict(ev.knobs)  # type: ignore[attr-defined]
        elif k == "rewound":
            kept = list(ev.kept_tokens)  # type: ignore[attr-defined]
            pos = ev.position  # type: ignore[attr-defined]
            del history[pos - len(kept) :]
            history.extend(kept)
            for gone in [x for x in order if x > ev.round]:
                rounds.pop(gone, None)
            order = [r for r in order if r <= ev.round]
            strategy = ev.strategy  # type: ignore[attr-defined]
            dg.knobs = dict(ev.knobs)  # type: ignore[attr-defined]
        elif k in ("draft_proposed", "accepted", "rejected"):
            rd = rounds.get(ev.round)
            if rd is None:
                rd = rounds[ev.round] = {"strategy": strategy}
                order.append(ev.round)
            rd[k] = ev
            if k == "accepted":
                pos = ev.position  # type: ignore[attr-defined]
                del history[pos:]
                history.extend(ev.tokens)  # type: ignore[attr-defined]
    copied = _copied_flags(history)
    seen_strategies: list[str] = []
    for idx in order:
        r = rounds[idx]
        d, a, rej = r.get("draft_proposed"), r.get("accepted"), r.get("rejected")
        if d is None or a is None:
            continue
        dg.rounds += 1
        toks = list(d.tokens)
        if not toks:
            if d.reason:
                dg.empty_reasons[d.reason] = dg.empty_reasons.get(d.reason, 0) + 1
            continue
        if r["strategy"] not in seen_strategies:
            seen_strategies.append(r["strategy"])
        dg.drafting_rounds += 1
        dg.drafted += len(toks)
        n_acc = a.n_accepted
        n_exam = min(len(toks), n_acc + (1 if rej is not None else 0))
        pieces, probs = list(d.pieces), list(d.probs)
        for i in range(n_exam):
            q = d.position + i
            ok = i < n_acc
            cls = token_class(pieces[i] if i < len(pieces) else "")
            cp = copied[q] if q < len(copied) else False
            dg.tokens.append(Examined(idx, i, cls, probs[i] if i < len(probs) else None, cp, ok, r["strategy"]))
            dg.examined += 1
            dg.accepted += int(ok)
        if rej is not None:
            rank = rej.draft_token_target_rank
            if rank is None:  # a recording made before ranks were recorded: the alternatives tell a near miss
                ids = [alt["token"] if isinstance(alt, dict) else alt[0] for alt in rej.alternatives]
                rank = ids.index(rej.tokens[0]) + 1 if rej.tokens and rej.tokens[0] in ids else None
            q = rej.position
            dg.rejections.append(
                RejectionRow(
                    round=idx,
                    position=q,
                    depth=rej.depth,
                    drafted=rej.tokens[0] if rej.tokens else -1,
                    drafted_piece=rej.pieces[0] if rej.pieces else "",
                    draft_prob=rej.draft_probs[0] if rej.draft_probs else None,
                    target_prob=rej.draft_token_target_prob,
                    target_rank=rank,
                    margin=rej.target_margin,
                    chosen=rej.target_token,
                    chosen_piece=rej.target_piece,
                    chosen_prob=rej.target_prob,
                    token_class=token_class(rej.pieces[0] if rej.pieces else ""),
                    copied=copied[q] if q < len(copied) else False,
                )
            )
    dg.strategies = seen_strategies
    return dg
