"""A diagnosis: the figures of a session's draft tokens and rejections, the findings drawn from them, a report.

:func:`specviz.analysis.diagnose.diagnose` fills a :class:`Diagnosis` from events (the terms — examined,
acceptance, copied spans — are defined there).

Per rejection (:class:`RejectionRow`): the round, the history position, the draft depth, the drafted
token and the drafter's own probability of it, the target's probability and rank of that token (1 = the
target's own choice), the target's top-two logit margin there, and the token the target chose instead.

Aggregates (:class:`Diagnosis`): acceptance by token class (:func:`token_class`), the most frequent
(drafted → chosen) pairs, the near-miss share (rejections whose drafted token was in the target's top
:data:`NEAR_MISS_K`), acceptance inside copied spans and elsewhere, acceptance by draft depth and by the
drafter's own probability (0.1-wide buckets).

Findings are short sentences derived from those numbers by the rules in :data:`RULES`, one function each
with its threshold as a named constant (stated in the finding), run in that order; a session in which no
draft token was examined gets one finding only (:func:`nothing_verified`).
"""

from __future__ import annotations

import re
import statistics
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

#: A rejection is a near miss when the drafted token was among the target's top this many.
NEAR_MISS_K = 5
#: Findings are made from groups of at least this many examined tokens (or rejections, or rounds).
MIN_SUPPORT = 8
#: Acceptance below which a deeper draft position costs more than it returns, unless a verify cost curve
#: gives the break-even (one extra token's marginal verify cost over a one-token decode's).
BREAK_EVEN = 0.4
#: Acceptance below which low-confidence drafts are worth cutting with draft_p_min.
LOW_CONFIDENCE_ACCEPTANCE = 0.25
#: Near-miss share at or above which rejections are named close calls.
NEAR_MISS_MOST = 0.5
#: Near-miss share at or below which the drafted tokens are named far from the target's.
NEAR_MISS_FEW = 0.2
#: Acceptance gap (inside copied spans minus elsewhere) at or above which the copied spans are named.
COPIED_GAP = 0.3
#: Acceptance gap (overall minus the class's) at or above which a token class is named.
CLASS_GAP = 0.25
#: Share of rejections at or above which one (drafted → chosen) pair is named.
PAIR_SHARE = 0.1
#: Share of rounds without a draft at or above which they are named (the finding says "half").
EMPTY_ROUND_SHARE = 0.5
#: Acceptance gap between two drafters of a chain at or above which the weaker one is named.
DRAFTER_GAP = 0.3
#: Share of drafted tokens impossible under the grammar at or above which they are named.
GRAMMAR_SHARE = 0.1
#: Token classes, in display order.
TOKEN_CLASSES = ("whitespace", "punctuation", "digits", "word start", "word continuation", "special", "other")
#: How many (drafted → chosen) pairs and rejection rows :meth:`Diagnosis.to_dict` lists.
TOP_PAIRS = 10
MAX_ROWS = 400

#: A finding: ``key`` (what it is about), ``threshold`` (the one it used) and ``text``.
Finding = dict[str, Any]

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
    drafter: str = ""  #: who proposed the refused token (a chain's member)
    grammar_forbidden: bool | None = None  #: the generation's grammar forbade it (None: no grammar)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class Examined:
    """One examined draft token: round, depth, its class, the drafter's probability, inside a copied span,
    accepted, the strategy in force and the drafter that proposed it (a chain's member; the strategy
    itself otherwise)."""

    round: int
    depth: int
    token_class: str
    draft_prob: float | None
    copied: bool
    accepted: bool
    strategy: str
    drafter: str = ""


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
    #: Drafted tokens impossible under the generation's grammar: a rejection's refused token the grammar
    #: forbade, and the tokens drafted after it (None: no round ran under a grammar).
    grammar_impossible: int | None = None

    # -- aggregates ------------------------------------------------------------------------------
    @property
    def acceptance(self) -> float | None:
        """Accepted over examined draft tokens."""
        return _rate(self.accepted, self.examined)

    def by_class(self) -> dict[str, dict[str, Any]]:
        """Acceptance by token class of the drafted token."""
        g = _group(self.tokens, lambda r: r.token_class)
        return {c: g[c] for c in TOKEN_CLASSES if c in g}

    def by_depth(self, strategy: str | None = None) -> list[dict[str, Any]]:
        """Acceptance by draft depth (0-based), given the target reached that depth; of ``strategy``'s drafts
        alone when it is given."""
        rows = self.tokens if strategy is None else [r for r in self.tokens if r.strategy == strategy]
        g = _group(rows, lambda r: r.depth)
        return [{"depth": d, **g[d]} for d in sorted(g)]

    def by_confidence(self) -> list[dict[str, Any]]:
        """Acceptance by the drafter's own probability, in buckets ``[lo, lo + 0.1)``."""
        g = _group(self.tokens, lambda r: None if r.draft_prob is None else min(int(r.draft_prob * 10), 9))
        return [{"lo": b / 10, "hi": (b + 1) / 10, **g[b]} for b in sorted(g)]

    def by_drafter(self) -> dict[str, dict[str, Any]]:
        """Acceptance by the drafter that proposed each token (a chain's members; one entry otherwise), with
        the drafting rounds each won and its acceptance by depth."""
        out = _group(self.tokens, lambda r: r.drafter or r.strategy)
        for name, g in out.items():
            mine = [r for r in self.tokens if (r.drafter or r.strategy) == name]
            g["rounds"] = len({r.round for r in mine})
            depth = _group(mine, lambda r: r.depth)
            g["by_depth"] = [{"depth": d, **depth[d]} for d in sorted(depth)]
        return out

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

    def grammar_impossible_share(self) -> float | None:
        """Share of drafted tokens impossible under the grammar (None: no grammar, or nothing drafted)."""
        return None if self.grammar_impossible is None else _rate(self.grammar_impossible, self.drafted)

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
    def findings(self) -> list[Finding]:
        """Short sentences derived from the figures, each with the threshold it used (``key``, ``text``,
        ``threshold``), most important first: those of every rule in :data:`RULES`, in order."""
        if self.examined == 0:
            return [nothing_verified(self)]
        return [f for rule in RULES for f in rule(self)]

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
            "by_drafter": self.by_drafter(),
            "copied": self.copied(),
            "near_miss_k": NEAR_MISS_K,
            "near_miss_share": self.near_miss_share(),
            "top_pairs": self.top_pairs(),
            "medians": self.medians(),
            "empty_reasons": dict(self.empty_reasons),
            "break_even": self.break_even,
            "break_even_source": self.break_even_source,
            "grammar_impossible": self.grammar_impossible,
            "grammar_impossible_share": self.grammar_impossible_share(),
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
        if len(d["by_drafter"]) > 1:
            lines.append("acceptance by drafter:")
            lines += [
                f"  {k:<18} {_pct(v['acceptance']):>5}  of {v['examined']} in {v['rounds']} rounds"
                for k, v in d["by_drafter"].items()
            ]
        lines.append(
            "copied spans: "
            + ", ".join(f"{k} {_pct(v['acceptance'])} of {v['examined']}" for k, v in d["copied"].items())
        )
        if d["grammar_impossible_share"] is not None:
            lines.append(
                f"impossible under the grammar: {_pct(d['grammar_impossible_share'])} of drafted tokens "
                f"({self.grammar_impossible} of {self.drafted})"
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


# -- the rules of the findings ---------------------------------------------------------------------


def _finding(key: str, threshold: float, text: str) -> Finding:
    return {"key": key, "threshold": threshold, "text": text}


def _reasons(empty_reasons: dict[str, int], n: int | None = None) -> str:
    """``"no-match 3, p-min 1"``: why rounds had no draft, most frequent first (the first ``n``)."""
    ranked = sorted(empty_reasons.items(), key=lambda x: -x[1])
    return ", ".join(f"{k} {v}" for k, v in ranked[:n])


def nothing_verified(dg: Diagnosis) -> Finding:
    """The only finding of a session in which no draft token was examined, with why the drafter stopped."""
    reasons = _reasons(dg.empty_reasons)
    text = "no draft token was verified" + (f" (the drafter stopped: {reasons})" if reasons else "")
    return {"key": "no-drafts", "text": text + ".", "threshold": None}


def depth_rule(dg: Diagnosis) -> list[Finding]:
    """Where drafts stop paying: the first depth past the first (with :data:`MIN_SUPPORT` examined tokens)
    whose acceptance is below the break-even (``dg.break_even``, by default :data:`BREAK_EVEN`) and the
    share of rejections there and beyond; else a first draft token accepted below the break-even."""
    depths, be = dg.by_depth(), dg.break_even
    cut = next(
        (
            d
            for d in depths
            if d["examined"] >= MIN_SUPPORT and d["acceptance"] is not None and d["acceptance"] < be and d["depth"] > 0
        ),
        None,
    )
    total_rej = len(dg.rejections)
    if cut is not None and total_rej:
        late = sum(1 for r in dg.rejections if r.depth >= cut["depth"])
        tail = [d for d in depths if d["depth"] >= cut["depth"]]
        t_ex, t_acc = sum(d["examined"] for d in tail), sum(d["accepted"] for d in tail)
        return [
            _finding(
                "depth",
                be,
                f"{late / total_rej:.0%} of rejections are at depth {cut['depth'] + 1} and beyond, where "
                f"{t_acc / t_ex:.0%} of draft tokens are accepted "
                f"(break-even {be:.0%}, {dg.break_even_source}): "
                f"drafts past {cut['depth']} token{'s' if cut['depth'] != 1 else ''} cost more than they return",
            )
        ]
    if depths and depths[0]["examined"] >= MIN_SUPPORT and (depths[0]["acceptance"] or 0) < be:
        return [
            _finding(
                "depth",
                be,
                f"the first draft token is accepted only {depths[0]['acceptance']:.0%} of the time (break-even "
                f"{be:.0%}, {dg.break_even_source}): drafting does not pay here at any length",
            )
        ]
    return []


def low_confidence_cut(conf: list[tuple[float, bool]]) -> tuple[float, float, int] | None:
    """``(cut, acceptance, tokens)``: among the cuts 0.1 … 0.9 whose :data:`MIN_SUPPORT` or more tokens below
    are accepted less than :data:`LOW_CONFIDENCE_ACCEPTANCE` of the time, the lowest one that removes as many
    tokens as the highest one; None when no cut qualifies. ``conf`` holds (draft probability, accepted)."""
    cands = []
    for t10 in range(1, 10):
        t = t10 / 10
        below = [ok for p, ok in conf if p < t]
        if len(below) >= MIN_SUPPORT:
            rate = sum(below) / len(below)
            if rate < LOW_CONFIDENCE_ACCEPTANCE:
                cands.append((t, rate, len(below)))
    if not cands:
        return None
    return next(c for c in cands if c[2] == cands[-1][2])


def confidence_rule(dg: Diagnosis) -> list[Finding]:
    """A draft_p_min worth setting: the drafts below a confidence cut (:func:`low_confidence_cut`) are
    mostly rejected and the session's draft_p_min is below that cut."""
    conf = [(r.draft_prob, r.accepted) for r in dg.tokens if r.draft_prob is not None]
    if len(conf) < MIN_SUPPORT:
        return []
    p_min = float(dg.knobs.get("draft_p_min", 0.0) or 0.0)
    best = low_confidence_cut(conf)
    if best is None or best[0] <= p_min:
        return []
    t, rate, n = best
    cuts = "cuts nothing" if not any(p < p_min for p, _ in conf) else "cuts too little"
    return [
        _finding(
            "confidence",
            LOW_CONFIDENCE_ACCEPTANCE,
            f"draft_p_min {p_min:g} {cuts}: drafts below {t:.1f} confidence are accepted {rate:.0%} of "
            f"the time ({n} tokens; threshold {LOW_CONFIDENCE_ACCEPTANCE:.0%}), so draft_p_min {t:.1f} "
            "would stop them",
        )
    ]


def near_miss_rule(dg: Diagnosis) -> list[Finding]:
    """Over :data:`MIN_SUPPORT` rejections or more: close calls when at least :data:`NEAR_MISS_MOST` of them
    were near misses, far-off guesses when at most :data:`NEAR_MISS_FEW` were."""
    nm = dg.near_miss_share()
    if nm is None or len(dg.rejections) < MIN_SUPPORT:
        return []
    med = dg.medians()
    if nm >= NEAR_MISS_MOST:
        margin = f", median top-two margin {med['margin']:.2f}" if med["margin"] is not None else ""
        return [
            _finding(
                "near-miss",
                NEAR_MISS_MOST,
                f"{nm:.0%} of rejections are near misses (the drafted token was in the target's top "
                f"{NEAR_MISS_K}{margin}): the drafter guesses the right kind of token and loses close calls",
            )
        ]
    if nm <= NEAR_MISS_FEW:
        rank = f" (median rank {med['target_rank']:.0f})" if med["target_rank"] is not None else ""
        return [
            _finding(
                "near-miss",
                NEAR_MISS_FEW,
                f"only {nm:.0%} of rejections are near misses{rank}: the drafted tokens are far from what "
                "the target wants",
            )
        ]
    return []


def copied_rule(dg: Diagnosis) -> list[Finding]:
    """The drafter pays where the output copies: acceptance inside copied spans at least :data:`COPIED_GAP`
    above acceptance elsewhere, each over :data:`MIN_SUPPORT` examined tokens or more."""
    cp = dg.copied()
    ins, els = cp.get("inside copied spans"), cp.get("elsewhere")
    if not (ins and els and ins["examined"] >= MIN_SUPPORT and els["examined"] >= MIN_SUPPORT):
        return []
    a_in, a_el = ins["acceptance"] or 0.0, els["acceptance"] or 0.0
    if a_in - a_el < COPIED_GAP:
        return []
    return [
        _finding(
            "copied",
            COPIED_GAP,
            f"acceptance is {a_in:.0%} inside copied spans and {a_el:.0%} elsewhere "
            f"(gap over {COPIED_GAP * 100:.0f} points): "
            "the drafter pays where the output copies; draft_policy=cost keeps drafts short elsewhere",
        )
    ]


def class_rule(dg: Diagnosis) -> list[Finding]:
    """Each token class (over :data:`MIN_SUPPORT` examined tokens or more) accepted at least
    :data:`CLASS_GAP` below the overall acceptance, in :data:`TOKEN_CLASSES` order."""
    overall = dg.acceptance or 0.0
    return [
        _finding(
            "class",
            CLASS_GAP,
            f"{cls} tokens are accepted {g['acceptance']:.0%} of the time against {overall:.0%} overall "
            f"({g['examined']} examined; a gap over {CLASS_GAP * 100:.0f} points)",
        )
        for cls, g in dg.by_class().items()
        if g["examined"] >= MIN_SUPPORT and g["acceptance"] is not None and overall - g["acceptance"] >= CLASS_GAP
    ]


def pair_rule(dg: Diagnosis) -> list[Finding]:
    """One (drafted → chosen) pair making at least :data:`PAIR_SHARE` of :data:`MIN_SUPPORT` or more
    rejections."""
    pairs = dg.top_pairs(1)
    if not pairs or len(dg.rejections) < MIN_SUPPORT or pairs[0]["share"] < PAIR_SHARE:
        return []
    p = pairs[0]
    return [
        _finding(
            "pair",
            PAIR_SHARE,
            f"{_q(p['drafted_piece'])} drafted where the target chose {_q(p['chosen_piece'])} makes "
            f"{p['share']:.0%} of rejections ({p['count']}; at least {PAIR_SHARE:.0%} to be named)",
        )
    ]


def empty_rounds_rule(dg: Diagnosis) -> list[Finding]:
    """Rounds that proposed no draft making at least :data:`EMPTY_ROUND_SHARE` of :data:`MIN_SUPPORT` or
    more rounds, with the three most frequent reasons."""
    empty = dg.rounds - dg.drafting_rounds
    if dg.rounds < MIN_SUPPORT or empty / dg.rounds < EMPTY_ROUND_SHARE:
        return []
    return [
        _finding(
            "no-draft",
            EMPTY_ROUND_SHARE,
            f"{empty / dg.rounds:.0%} of rounds proposed no draft ({_reasons(dg.empty_reasons, 3)}): those rounds "
            "are plain decoding (at least half to be named)",
        )
    ]


def drafter_rule(dg: Diagnosis) -> list[Finding]:
    """In a chain, a drafter whose acceptance trails the best one's by :data:`DRAFTER_GAP` or more, each with
    :data:`MIN_SUPPORT` examined tokens or more: it wins rounds it then loses (llama.cpp asks the members in
    a fixed order, so a weak member earlier in it takes rounds a later one might have drafted better)."""
    g = {k: v for k, v in dg.by_drafter().items() if v["examined"] >= MIN_SUPPORT}
    if len(g) < 2:
        return []
    best = max(g, key=lambda k: g[k]["acceptance"])
    out = []
    for name, v in g.items():
        gap = g[best]["acceptance"] - v["acceptance"]
        if name != best and gap >= DRAFTER_GAP:
            out.append(
                _finding(
                    "drafter",
                    DRAFTER_GAP,
                    f"the chain's {name} drafts are accepted {_pct(v['acceptance'])} (of {v['examined']}), "
                    f"{best}'s {_pct(g[best]['acceptance'])}: {name} wins {v['rounds']} rounds it mostly loses "
                    f"(a gap of at least {DRAFTER_GAP:.0%} to be named); try the chain without it",
                )
            )
    return out


def grammar_rule(dg: Diagnosis) -> list[Finding]:
    """Drafted tokens the grammar made impossible, at least :data:`GRAMMAR_SHARE` of :data:`MIN_SUPPORT` or
    more drafted tokens: the drafter copies text the grammar (a JSON schema) forbids."""
    share = dg.grammar_impossible_share()
    if share is None or dg.drafted < MIN_SUPPORT or share < GRAMMAR_SHARE:
        return []
    return [
        _finding(
            "grammar",
            GRAMMAR_SHARE,
            f"{share:.0%} of drafted tokens were impossible under the grammar ({dg.grammar_impossible} of "
            f"{dg.drafted}; at least {GRAMMAR_SHARE:.0%} to be named): the drafter proposes text the schema "
            "forbids; chain the grammar drafter in front (--spec-type grammar,ngram-mod) or draft shorter",
        )
    ]


#: The rules of :meth:`Diagnosis.findings`, in the order their findings are listed.
RULES: tuple[Callable[[Diagnosis], list[Finding]], ...] = (
    grammar_rule,
    drafter_rule,
    depth_rule,
    confidence_rule,
    near_miss_rule,
    copied_rule,
    class_rule,
    pair_rule,
    empty_rounds_rule,
)
