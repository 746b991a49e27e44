"""A specviz session driven through ``llama-server``'s generation loop, so that the two can be compared
request for request: the same text, and the same drafted and accepted counts as the server's
``timings.draft_n`` / ``draft_n_accepted`` and its Prometheus counters.

The server's loop (``tools/server/server-context.cpp`` of the llama.cpp llama-cpp-python 0.3.36 vendors)
differs from a plain specviz session in three ways, all reproduced by :func:`run_like_the_server`:

* it evaluates the whole prompt, begins the drafter with it (``common_speculative_begin`` sees every prompt
  token; ``speculative-simple`` leaves the last one out) and samples the first token *without drafting*;
  the first draft comes after that token. The session runs its first round with ``none`` and switches to
  the strategy at the next boundary, so that the drafter begins with the same tokens; a session made with
  ``prefill="whole"`` (as :func:`~specviz.analysis.server_args.session_from_server_args` makes it) also
  evaluates the prompt as the server does, which on kernels that are not batch-invariant is what gives the
  server's text (see :class:`~specviz.Session`);
* each round's draft is capped at ``min(n_ctx - n_cached - 2, n_remaining - 1)``
  (``server_slot::get_n_draft_max``, ``n_cached`` the tokens in the cache, ``n_remaining`` the tokens
  still allowed), and a round whose cap is not positive does not draft at all;
* an n-gram type drafts up to its own length (``--spec-draft-n-max`` caps model drafts only), with no
  verify-tile alignment: :func:`~specviz.analysis.server_args.parse_server_args` sets the knobs so.

The cap is given to the session as ``draft_max`` whenever it is below the strategy's own length; the
session's own budget already caps at ``n_remaining - 1`` and drops a draft shorter than ``draft_min``
(as llama.cpp drops one shorter than ``--spec-draft-n-min``).

What it cannot reproduce, stated where it matters: the server's n-gram statistics of ``ngram-mod`` and
``ngram-cache`` live as long as the server process — a second request starts from what the first one
left — while a specviz session starts every request afresh (:attr:`ServerLikeRun` counts one request);
and in the last ``draft_min + 1`` positions of the context the server stops drafting one position before
the session does (its cap keeps one position spare).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

#: the counters llama-server reports per request, as :class:`ServerLikeRun` and :class:`ServerLoop` hold them
SERVER_COUNTS = ("draft_n", "draft_n_accepted", "verify_steps", "accepted_per_pos")


def server_counts(run: Any) -> dict[str, Any]:
    """:data:`SERVER_COUNTS` of a :class:`ServerLikeRun` or a :class:`ServerLoop`, as a dictionary."""
    return {k: (list(v) if isinstance(v := getattr(run, k), list) else v) for k in SERVER_COUNTS}


def server_draft_cap(n_ctx: int, n_cached: int, n_predict: int | None, n_generated: int) -> int:
    """llama-server's cap on a round's draft (``get_n_draft_max``): ``n_ctx - n_cached - 2``, and with a
    token limit at most ``n_remaining - 1``; a cap that is not positive means no draft."""
    cap = n_ctx - n_cached - 2
    if n_predict is not None and n_predict >= 0:
        remaining = n_predict - n_generated
        if remaining > 0:
            cap = min(cap, remaining - 1)
    return cap


@dataclass
class ServerLikeRun:
    """One request as llama-server would count it, from a specviz session run through its loop."""

    tokens: list[int]
    text: str
    draft_n: int  #: draft tokens verified (``timings.draft_n``)
    draft_n_accepted: int  #: of which accepted (``timings.draft_n_accepted``)
    verify_steps: int  #: rounds that verified a draft (``spec_decode_num_drafts_total``)
    accepted_per_pos: list[int] = field(default_factory=list)  #: verify steps that accepted position i
    finish: str | None = None
    decode_seconds: float = 0.0  #: the rounds' time (the prompt excluded), as ``timings.predicted_ms``
    content: str = ""  #: the text as the server's ``content`` holds it (:func:`server_content`)

    @property
    def acceptance(self) -> float:
        """Accepted over drafted (0 without drafts)."""
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over the rounds' seconds."""
        return len(self.tokens) / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        d = dict(self.__dict__)
        d["acceptance"] = self.acceptance
        d["tokens_per_second"] = self.tokens_per_second
        return d


class ServerLoop:
    """llama-server's generation loop for one request, around a session's rounds (see the module docstring):
    :attr:`start_strategy` / :attr:`start_knobs` to start it with, :meth:`before_round` before every round
    (the strategy from the second round on, the round's draft cap), :meth:`count` after it, and
    :meth:`result`. :func:`run_like_the_server` runs one request through it; a batched run
    (:mod:`specviz.analysis.request_runs`) calls the same three around each step of its slots' sessions.

    ``n_ctx`` is the slot's context (default: the session's capacity, which for a slot of a batched run is its
    share, ``n_ctx_seq``)."""

    def __init__(
        self,
        strategy: str,
        knobs: dict[str, Any],
        n_predict: int,
        *,
        n_ctx: int | None = None,
        plain_first: bool = True,
    ) -> None:
        self.strategy, self.n_predict, self.n_ctx = strategy, n_predict, n_ctx
        self.knobs = dict(knobs)
        self.drafts = strategy != "none"
        # a line with no --spec-type: plain decoding
        self.top = int(self.knobs.setdefault("draft_max", 16)) if self.drafts else 0
        self.plain_first = plain_first and self.drafts
        self.accepted_per_pos: list[int] = []
        self.verify_steps = self.draft_n = self.draft_n_accepted = 0
        self.seconds = 0.0

    @property
    def start_strategy(self) -> str:
        """The strategy the request starts with (``none`` for the server's plain first token)."""
        return "none" if self.plain_first else self.strategy

    @property
    def start_knobs(self) -> dict[str, Any]:
        """The knobs the request starts with."""
        return {} if self.plain_first else dict(self.knobs)

    def before_round(self, session: Any) -> None:
        """Configure ``session`` for its next round as the server would run it: the strategy once the first
        token is out (the drafter begins with the prompt and it), the draft capped by the slot's room."""
        k = self.knobs
        if session.strategy == "none" and self.drafts and session.round_index == 1:
            session.configure(self.strategy, **k)
        n_ctx = self.n_ctx or session.ctx.capacity.n_ctx
        cap = server_draft_cap(n_ctx, len(session.history) - 1, self.n_predict, len(session.tokens))
        want = min(cap, self.top)
        allowed = want >= max(1, k.get("draft_min", 0))
        if self.drafts and session.round_index >= 1 and want != k["draft_max"] and allowed:
            k["draft_max"] = want
            session.configure(draft_max=want)

    def count(self, events: Sequence[Any]) -> bool:
        """Count one round's events as the server counts its verify steps; False when no round ran (the
        generation ended before one)."""
        draft = next((e for e in events if e.kind == "draft_proposed"), None)
        verified = next((e for e in events if e.kind == "verified"), None)
        accepted = next((e for e in events if e.kind == "accepted"), None)
        if draft is None or verified is None or accepted is None:
            return False
        self.seconds += float(verified.round_seconds or 0.0)
        n, n_acc = len(draft.tokens), int(accepted.n_accepted)
        if n:
            self.verify_steps += 1
            self.draft_n += n
            self.draft_n_accepted += n_acc
            if len(self.accepted_per_pos) < n:
                self.accepted_per_pos += [0] * (n - len(self.accepted_per_pos))
            for i in range(n_acc):
                self.accepted_per_pos[i] += 1
        return True

    def counts(self) -> dict[str, Any]:
        """The server's counters so far (:data:`SERVER_COUNTS`)."""
        return server_counts(self)

    def result(self, session: Any) -> ServerLikeRun:
        """The request as the server counts it, from ``session``'s finished generation."""
        return ServerLikeRun(
            tokens=list(session.tokens),
            text=session.text,
            draft_n=self.draft_n,
            draft_n_accepted=self.draft_n_accepted,
            verify_steps=self.verify_steps,
            accepted_per_pos=list(self.accepted_per_pos),
            finish=session.finished,
            decode_seconds=self.seconds,
            content=server_content(session.model, session.tokens),
        )


def run_like_the_server(
    session: Any,
    prompt: str | Sequence[int] | None,
    n_predict: int,
    strategy: str,
    knobs: dict[str, Any],
    *,
    n_ctx: int | None = None,
    plain_first: bool = True,
    **start: Any,
) -> ServerLikeRun:
    """Run ``session`` on one request the way llama-server generates it (see the module docstring) and
    count it as the server does (:class:`ServerLoop`).

    ``knobs`` should be what :func:`~specviz.analysis.server_args.parse_server_args` gives (n-gram types at
    their own length, alignment off, the ``fixed`` policy). ``n_ctx`` is the slot's context (default: the
    session's). ``plain_first`` False drafts from the first round, as a plain specviz session does (to show
    what the server's plain first token changes). ``start`` goes to :meth:`~specviz.Session.start`
    (``messages``, ``stop``, sampling)."""
    loop = ServerLoop(strategy, knobs, n_predict, n_ctx=n_ctx, plain_first=plain_first)
    session.start(prompt, n_predict, loop.start_strategy, **start, **loop.start_knobs)
    while session.finished is None:
        loop.before_round(session)
        if not loop.count(session.step().events):
            break
    return loop.result(session)


def server_content(model: Any, tokens: Sequence[int]) -> str:
    """The text of ``tokens`` as llama-server's ``content`` holds it: the text of control and unknown tokens
    (the end-of-generation token among them) left out, where specviz's pieces render every token (the
    server renders them only with ``--special``). Departure: a stop string is not cut here."""
    return b"".join(model.content_bytes(t) for t in tokens).decode("utf-8", "replace")
