"""llama-server with synthetic acceptance: the hardware's speedup at a given acceptance by draft position,
whatever the text (issue 54's "the draft apart from the hardware").

:func:`measure_synthetic` starts llama-server twice on one model (loopback, :class:`.LlamaServer`): plain
(``--spec-type none``) and drafting with ngram-simple under ``--spec-synth-rates`` (the rates of
:mod:`.synth_rates`, e.g. a recording's), sends the same prompt to each and returns both servers' tokens/s
as the servers time them (``timings.predicted_n`` over ``predicted_ms``, the prompt excluded) and the
synthetic server's counters (``/metrics``). :func:`synthetic_curve` does it for several rate sets against
one plain measurement: the speedup against acceptance on this machine.

Why ngram-simple with an n-gram of one token: the synthetic acceptance applies only to what the drafter
drafts (a position the draft does not have is never decided), so the drafter must draft the full length
nearly every round, whatever the text. ngram-simple needs no draft model (the server's synthetic
acceptance only needs a speculative type); with ``size_n`` 1 it drafts whenever the last token occurred
before with ``size_m`` tokens after it — on a prompt that repeats (the default, :data:`PROMPT`) and on what
the synthetic acceptance then commits (copies of earlier text), nearly always. The counters say how
nearly: :attr:`SyntheticRun.full_share`. Both servers get ``ignore_eos`` so they generate the same number
of tokens.

Rates are checked as the server checks them before any server starts (:func:`.synth_rates.check_rates`);
``args`` (the deployment's context settings, ``-t``, ``-c`` ...) may set no ``--spec-*`` flag and no draft
model (``-md``): the synthetic server's drafting is set here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import KnobError
from .llama_server import Completion, LlamaServer
from .server_metrics import ServerMetrics, metrics_delta, parse_metrics
from .synth_rates import check_rates, format_rates

#: The default prompt: a passage said three times, so that a one-token n-gram finds an earlier occurrence
#: with a full draft after it (see the module docstring).
PROMPT = (
    "The verifier reads every drafted token in one batch and keeps the longest prefix it agrees with. "
    "When the draft is right, several tokens cost one pass; when it is wrong, the extra rows are wasted. "
) * 3

#: Flags the synthetic server's drafting is made of; a caller's ``args`` may not set them.
OWN_FLAGS = ("--spec-", "-md", "--model-draft", "--draft")


@dataclass
class SyntheticRun:
    """One rate set measured: the plain and the synthetic server's tokens/s and the synthetic server's
    counters for the requests sent."""

    rates: tuple[float, ...]
    plain_tokens_per_second: float
    synthetic_tokens_per_second: float
    metrics: ServerMetrics  #: the synthetic server's counters over the requests sent
    n_predict: int
    repeats: int
    args: list[str] = field(default_factory=list)  #: the synthetic server's command line (less -m, host, port)

    @property
    def speedup(self) -> float:
        """Synthetic over plain tokens/s (0 when plain was not measured)."""
        p = self.plain_tokens_per_second
        return self.synthetic_tokens_per_second / p if p > 0 else 0.0

    @property
    def synth_len(self) -> float:
        """The rates' mean accepted length with the target's token, ``1 + sum(rates)``."""
        return 1.0 + sum(self.rates)

    @property
    def full_share(self) -> float:
        """Draft tokens over the full length of every step's draft: 1 when every draft had a token for
        every rate (the server's per-position counts then estimate the rates themselves)."""
        m = self.metrics
        return m.draft_tokens / (m.drafts * len(self.rates)) if m.drafts and self.rates else 0.0

    @property
    def observed(self) -> list[float]:
        """The server's per-position acceptance over its steps (``/metrics``, over all steps)."""
        return self.metrics.per_position()

    def report(self) -> str:
        """One paragraph: the rates, both speeds, the speedup, what the server counted."""
        m = self.metrics
        seen = ", ".join(f"{x:.2f}" for x in self.observed)
        return (
            f"--spec-synth-rates {format_rates(self.rates)} (mean accepted length {self.synth_len:.2f}): "
            f"{self.synthetic_tokens_per_second:.1f} tokens/s against {self.plain_tokens_per_second:.1f} plain, "
            f"{self.speedup:.2f}x; the server drafted {m.draft_tokens} tokens in {m.drafts} steps "
            f"({self.full_share:.0%} of full length), accepted {m.accepted}; per position {seen}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "rates": list(self.rates),
            "synth_len": self.synth_len,
            "plain_tokens_per_second": self.plain_tokens_per_second,
            "synthetic_tokens_per_second": self.synthetic_tokens_per_second,
            "speedup": self.speedup,
            "full_share": self.full_share,
            "observed": self.observed,
            "metrics": self.metrics.to_dict(),
            "n_predict": self.n_predict,
            "repeats": self.repeats,
            "args": list(self.args),
        }


def synthetic_args(rates: Sequence[float]) -> list[str]:
    """The synthetic server's drafting flags: ngram-simple with a one-token n-gram, one draft position per
    rate, and the rates (checked as the server checks them)."""
    checked = check_rates(rates)
    return [
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "1",
        "--spec-ngram-simple-size-m",
        str(len(checked)),
        "--spec-synth-rates",
        format_rates(checked),
    ]


def _check_args(args: Sequence[str]) -> list[str]:
    """``args`` as strings, refused when one sets the drafting (:data:`OWN_FLAGS`)."""
    out = [str(a) for a in args]
    own = [a for a in out if a.startswith(OWN_FLAGS)]
    if own:
        raise KnobError(
            f"llama-server option {own[0]}: the synthetic server's drafting is set by specviz; pass only the "
            "deployment's settings (-c, -t, -fa ...)",
            knob=own[0],
        )
    return out


def _speed(
    model: str | os.PathLike,
    args: list[str],
    prompt: str | Sequence[int],
    n_predict: int,
    repeats: int,
    seed: int,
    binary: Any,
) -> tuple[float, ServerMetrics]:
    """One server's tokens/s over ``repeats`` requests (the server's own timings) and its counters for them."""
    with LlamaServer(model, [*args, "--metrics"], binary=binary) as srv:
        before = parse_metrics(srv.metrics())
        outs: list[Completion] = [
            srv.complete(prompt, n_predict, seed=seed + i, ignore_eos=True) for i in range(repeats)
        ]
        after = parse_metrics(srv.metrics())
    ms = sum(o.predicted_ms for o in outs)
    n = sum(o.predicted_n for o in outs)
    return (n / (ms / 1000.0) if ms > 0 else 0.0), metrics_delta(after, before)


def synthetic_curve(
    model: str | os.PathLike,
    rate_sets: Sequence[Sequence[float]],
    *,
    prompt: str | Sequence[int] = PROMPT,
    n_predict: int = 128,
    repeats: int = 1,
    seed: int = 0,
    args: Sequence[str] = (),
    binary: str | os.PathLike | None = None,
) -> list[SyntheticRun]:
    """Each rate set of ``rate_sets`` measured in llama-server against one plain measurement (see the
    module docstring). ``args``: the deployment's settings for both servers; ``seed``: the first request's
    seed (it seeds the server's synthetic coin; each repeat the next). Every rate set is checked before a
    server starts (:class:`~specviz.errors.KnobError`)."""
    if not 1 <= int(n_predict) <= 1 << 16 or not 1 <= int(repeats) <= 50:
        raise KnobError(f"n_predict {n_predict} / repeats {repeats}: need 1..65536 tokens and 1..50 repeats")
    base = _check_args(args)
    flags = [synthetic_args(r) for r in rate_sets]
    if not flags:
        raise KnobError("no rate set to measure: pass at least one", knob="synth_rates")
    plain, _ = _speed(model, [*base, "--spec-type", "none"], prompt, n_predict, repeats, seed, binary)
    out = []
    for f in flags:
        speed, metrics = _speed(model, [*base, *f], prompt, n_predict, repeats, seed, binary)
        rates = check_rates([float(x) for x in f[-1].split(",")])
        out.append(SyntheticRun(rates, plain, speed, metrics, int(n_predict), int(repeats), [*base, *f]))
    return out


def measure_synthetic(
    model: str | os.PathLike,
    rates: Sequence[float],
    **options: Any,
) -> SyntheticRun:
    """``rates`` measured in llama-server on ``model``: plain and synthetic tokens/s and the synthetic
    server's counters (:func:`synthetic_curve` with one rate set; the same options)."""
    return synthetic_curve(model, [rates], **options)[0]
