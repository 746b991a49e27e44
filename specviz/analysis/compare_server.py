"""A running ``llama-server``'s own evidence beside specviz's reproduction of the same requests.

:func:`compare_server` reads the server's ``/metrics`` (it must run with ``--metrics``), ``/props`` and,
where enabled, ``/slots``; reproduces the requests of a request log (:mod:`specviz.sweep.request_log`)
through the server's generation loop (:func:`~specviz.analysis.server_repro.run_like_the_server`) with
the server's configuration (its command line, :func:`~specviz.analysis.server_args.parse_server_args`,
else what ``/slots`` and ``/props`` tell); and sets the two side by side: acceptance rate, draft tokens
per verification step, per-position acceptance (the server's figure: steps accepted up to position ``i``
over all steps, from ``spec_decode_num_accepted_tokens_per_pos_total``), generated and prompt tokens, and
the server's decodes with its busy slots per decode (``n_busy_slots_per_decode``: how many requests shared
each decode; the reproduction runs one request at a time, 1). Where they differ,
:attr:`ServerComparison.findings` says so in words and names the setting that would explain it.

With ``send=True`` the requests are first sent to the server (``POST /v1/chat/completions``) and only
what they added to its counters is compared; otherwise the counters are taken as they are — everything
the server served since it started, which the log should be.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import LlamaServerError, StrategyError
from .llama_server import fetch_text, http_request
from .server_args import ServerConfig, parse_server_args, strategy_of_spec_types
from .server_metrics import ServerMetrics, metrics_delta, parse_metrics
from .server_repro import ServerLikeRun, run_like_the_server

#: an absolute difference in acceptance (or per-position acceptance) below this counts as agreement
ACCEPTANCE_TOLERANCE = 0.02
#: a relative difference in counts below this counts as agreement
COUNT_TOLERANCE = 0.05


@dataclass
class ServerComparison:
    """The server's counters and specviz's reproduction of the same requests, and what differs."""

    url: str
    server: ServerMetrics
    specviz: ServerMetrics
    n_requests: int
    config: ServerConfig
    temperature: float
    sent: bool
    findings: list[str] = field(default_factory=list)
    runs: list[ServerLikeRun] = field(default_factory=list, repr=False)
    #: with ``sent``: the ids of the requests whose text from the server differs from the reproduction's
    parted: list[str] = field(default_factory=list)
    slots: list[dict[str, Any]] | None = field(default=None, repr=False)
    props: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def agree(self) -> bool:
        """Whether nothing was found to differ."""
        return not self.findings

    def rows(self) -> list[tuple[str, str, str]]:
        """(figure, server, specviz) rows of the side-by-side table."""
        a, b = self.server, self.specviz

        def pct(x: float) -> str:
            return f"{x:.1%}"

        def known(x: float | None, fmt: str) -> str:
            return "—" if x is None else format(x, fmt)

        out = [
            ("requests", "—" if not self.sent else str(self.n_requests), str(self.n_requests)),
            ("generated tokens", str(a.tokens_predicted), str(b.tokens_predicted)),
            ("prompt tokens", str(a.prompt_tokens), str(b.prompt_tokens)),
            ("verification steps", str(a.drafts), str(b.drafts)),
            ("draft tokens", str(a.draft_tokens), str(b.draft_tokens)),
            ("accepted tokens", str(a.accepted), str(b.accepted)),
            ("acceptance rate", pct(a.acceptance), pct(b.acceptance)),
            ("draft tokens per step", f"{a.mean_draft_length:.2f}", f"{b.mean_draft_length:.2f}"),
            ("decodes", known(a.decodes, "d"), known(b.decodes, "d")),
            ("busy slots per decode", known(a.busy_slots_per_decode, ".2f"), known(b.busy_slots_per_decode, ".2f")),
        ]
        pa, pb = a.per_position(), b.per_position()
        for i in range(max(len(pa), len(pb))):
            out.append(
                (
                    f"accepted at position {i}",
                    pct(pa[i]) if i < len(pa) else "—",
                    pct(pb[i]) if i < len(pb) else "—",
                )
            )
        return out

    def report(self) -> str:
        """The table and the findings, as text."""
        rows = self.rows()
        w = max(len(r[0]) for r in rows)
        lines = [
            f"llama-server at {self.url} vs specviz's reproduction ({self.config.strategy}, "
            f"{self.config.settings.describe()})",
            f"{'':<{w}}  {'server':>10}  {'specviz':>10}",
        ]
        lines += [f"{name:<{w}}  {x:>10}  {y:>10}" for name, x, y in rows]
        if self.findings:
            lines.append("where they differ:")
            lines += [f"  - {f}" for f in self.findings]
        else:
            lines.append("they agree (acceptance within 2 points, counts within 5%)")
        lines += [f"note: {w_}" for w_ in self.config.warnings_one_at_a_time("compare-server's reproduction")]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "url": self.url,
            "server": self.server.to_dict(),
            "specviz": self.specviz.to_dict(),
            "n_requests": self.n_requests,
            "config": self.config.to_dict(),
            "temperature": self.temperature,
            "sent": self.sent,
            "agree": self.agree,
            "findings": list(self.findings),
            "parted": list(self.parted),
            "runs": [r.to_dict() for r in self.runs],
        }

    def _repr_html_(self) -> str:  # a notebook shows the table
        import html

        cells = "".join(
            f"<tr><td>{html.escape(n)}</td><td>{html.escape(x)}</td><td>{html.escape(y)}</td></tr>"
            for n, x, y in self.rows()
        )
        found = "".join(f"<li>{html.escape(f)}</li>" for f in self.findings) or "<li>they agree</li>"
        return (
            f"<p>llama-server at {html.escape(self.url)} vs specviz</p><table><tr><th></th><th>server</th>"
            f"<th>specviz</th></tr>{cells}</table><ul>{found}</ul>"
        )


def _runs(kinds: list[str]) -> bool:
    """Whether specviz runs the server's types (one of them, or a chain of them)."""
    try:
        strategy_of_spec_types([",".join(kinds)])
    except StrategyError:
        return False
    return True


def _config_from_server(slots: list[dict[str, Any]] | None, props: dict[str, Any]) -> tuple[ServerConfig, list[str]]:
    """A configuration from what the server tells (no command line given), and what it could not tell."""
    types = ""
    for slot in slots or []:
        types = str((slot.get("params") or {}).get("speculative.types") or types)
    line: list[str] = []
    notes: list[str] = []
    # the server lists its types with "none" first ("none,ngram-simple")
    kinds = [t.strip() for t in types.split(",") if t.strip() and t.strip() != "none"]
    first = kinds[0] if kinds else ""
    if first and _runs(kinds):
        line += ["--spec-type", ",".join(kinds)]
    elif first:
        notes.append(f"the server drafts with {','.join(kinds)}, which specviz does not run")
    else:
        notes.append("/slots is disabled or shows no task yet: the server's --spec-type is unknown (taken as none)")
    n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
    if n_ctx:
        line += ["-c", str(n_ctx)]
    cfg = parse_server_args(line)
    if cfg.strategy != "none":
        notes.append(
            f"the server's --spec-* knobs are not exposed over HTTP: specviz used llama.cpp's defaults for "
            f"{first}; pass the server's command line (server_args) to use its own"
        )
    return cfg, notes


def _send(
    url: str, messages: list[dict[str, str]], n_predict: int, temperature: float, seed: int | None, grammar: Any = None
) -> str | None:
    """One chat request to the server (``grammar``: the GBNF specviz runs the request under, sent as the
    request's ``grammar``); the text of its answer (None when the answer has none)."""
    import json

    body: dict[str, Any] = {"messages": messages, "max_tokens": n_predict, "temperature": temperature}
    if seed is not None:
        body["seed"] = seed
    if grammar is not None:
        body["grammar"] = grammar
    status, raw = http_request(url, "POST", "/v1/chat/completions", body)
    if status != 200:
        raise LlamaServerError(f"llama-server at {url} refused a chat request ({status}): {raw[:300]!r}")
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


def _read_requests(requests: Sequence[Any] | str | os.PathLike) -> list[Any]:
    """The requests to compare: a request log read (refused when a line is malformed), or the list given;
    refused when there is none."""
    from ..sweep.request_log import read_request_log

    if isinstance(requests, (str, os.PathLike)):
        requests, problems = read_request_log(Path(requests))
        if problems:
            raise LlamaServerError(f"the request log has malformed lines: {problems[0]} ...")
    requests = list(requests)
    if not requests:
        raise LlamaServerError("no request to compare: pass a request log with at least one chat request")
    return requests


def _server_state(url: str) -> tuple[ServerMetrics, dict[str, Any], list[dict[str, Any]] | None]:
    """The server's counters (refused without ``--metrics``), its ``/props`` (empty when unreadable) and its
    ``/slots`` (None when disabled or unreadable)."""
    import json

    try:
        before = parse_metrics(fetch_text(url, "/metrics"))
    except LlamaServerError as e:
        raise LlamaServerError(f"{e}; start the server with --metrics to compare with it") from None
    props: dict[str, Any] = {}
    try:
        props = json.loads(fetch_text(url, "/props"))
    except (LlamaServerError, ValueError):
        props = {}
    slots: list[dict[str, Any]] | None
    try:
        slots = json.loads(fetch_text(url, "/slots"))
    except (LlamaServerError, ValueError):
        slots = None
    return before, props, slots


def _model_path(model: Any, config: ServerConfig, props: dict[str, Any]) -> Any:
    """The GGUF to reproduce with: ``model``, else the command line's, else the server's ``model_path``;
    refused when it is not a file here."""
    path = model if model is not None else config.model or props.get("model_path")
    if path is None or (isinstance(path, (str, os.PathLike)) and not Path(path).is_file()):
        raise LlamaServerError(
            f"the server's model {props.get('model_path')!r} is not a file here: pass the GGUF to reproduce "
            "with (model=PATH, --model PATH)"
        )
    return path


def _reproduce(
    session: Any, requests: list[Any], config: ServerConfig, plan: Callable[[Any], tuple[int, float, int | None]]
) -> tuple[list[ServerLikeRun], int, list[float]]:
    """Each request run through the server's generation loop on ``session`` (its length, temperature and seed
    from ``plan``): the runs, the prompt tokens they read and the temperatures they ran at."""
    runs: list[ServerLikeRun] = []
    prompt_tokens = 0
    temps: list[float] = []
    for r in requests:
        n, t, seed = plan(r)
        temps.append(t)
        extra: dict[str, Any] = {"temperature": t}
        if seed is not None and t > 0:
            extra["seed"] = int(seed)
        if config.chat_template:
            extra["chat_template"] = config.chat_template
        grammar = r.options.get("grammar", config.grammar)  # the request's own, else the server line's
        if grammar is not None:
            extra["grammar"] = grammar
        run = run_like_the_server(session, None, n, config.strategy, config.knobs, messages=r.message_dicts(), **extra)
        runs.append(run)
        prompt_tokens += int(session.n_prompt)
    return runs, prompt_tokens, temps


def _summed(runs: list[ServerLikeRun], prompt_tokens: int) -> ServerMetrics:
    """The reproduction's runs as the server's counters would count them."""
    npos = max((len(x.accepted_per_pos) for x in runs), default=0)
    return ServerMetrics(
        drafts=sum(x.verify_steps for x in runs),
        draft_tokens=sum(x.draft_n for x in runs),
        accepted=sum(x.draft_n_accepted for x in runs),
        accepted_per_pos=[sum(x.accepted_per_pos[i] for x in runs if i < len(x.accepted_per_pos)) for i in range(npos)],
        tokens_predicted=sum(len(x.tokens) for x in runs),
        predicted_seconds=sum(x.decode_seconds for x in runs),
        prompt_tokens=prompt_tokens,
        busy_slots_per_decode=1.0 if runs else None,  # one request at a time: every decode holds one
    )


def compare_server(
    url: str,
    requests: Sequence[Any] | str | os.PathLike,
    *,
    model: str | os.PathLike | Any = None,
    server_args: str | Sequence[str] | None = None,
    send: bool = False,
    max_tokens: int = 128,
    session: Any = None,
) -> ServerComparison:
    """The server at ``url`` beside specviz's reproduction of ``requests`` (a request log path, or its
    :class:`~specviz.sweep.request_log.LoggedRequest` list). See the module docstring.

    ``model``: the GGUF to reproduce with (default: the server's ``/props`` ``model_path``, when that file
    is here); ``server_args``: the server's command line (its ``--spec-*`` knobs and context settings);
    ``max_tokens``: the length of a request that names none (else the request's own, else ``-n``);
    ``session``: a :class:`~specviz.Session` to reuse (its model and context are used as they are).
    """
    from ..decoding.session import Session

    url = url.rstrip("/")
    requests = _read_requests(requests)
    before, props, slots = _server_state(url)
    notes: list[str] = []
    if server_args is not None:
        config = parse_server_args(server_args)
    else:
        config, notes = _config_from_server(slots, props)
    defaults = (props.get("default_generation_settings") or {}).get("params") or {}
    default_temp = float(config.sampling.get("temperature", defaults.get("temperature", 0.8)))

    def plan(r: Any) -> tuple[int, float, int | None]:
        n = int(r.options.get("max_tokens") or config.n_predict or max_tokens)
        return n, float(r.options.get("temperature", default_temp)), r.options.get("seed")

    answers: list[str | None] = []
    if send:
        for r in requests:
            n, t, seed = plan(r)
            answers.append(_send(url, r.message_dicts(), n, t, seed, r.options.get("grammar")))
        server = metrics_delta(parse_metrics(fetch_text(url, "/metrics")), before)
    else:
        server = before

    own = session is None
    if own:
        session = Session(_model_path(model, config, props), **config.session_kwargs())
    try:
        runs, prompt_tokens, temps = _reproduce(session, requests, config, plan)
    finally:
        if own:
            session.close()
    repro = _summed(runs, prompt_tokens)
    temperature = max(temps) if temps else 0.0
    parted = [r.id for r, run, text in zip(requests, runs, answers) if text is not None and text != run.content]
    cmp = ServerComparison(url, server, repro, len(requests), config, temperature, send, runs=runs, slots=slots)
    cmp.parted = parted
    cmp.props = props
    cmp.findings = explain(cmp) + notes
    return cmp


def _differs(a: float, b: float, tol: float = COUNT_TOLERANCE) -> bool:
    return abs(a - b) > tol * max(abs(a), abs(b), 1.0)


def explain(c: ServerComparison) -> list[str]:
    """Where the server's counters and the reproduction differ, in words, each with the setting that would
    explain it (empty when they agree)."""
    a, b, cfg = c.server, c.specviz, c.config
    out: list[str] = []
    if not c.sent and a.tokens_predicted > b.tokens_predicted * (1 + COUNT_TOLERANCE):
        out.append(
            f"the server generated {a.tokens_predicted} tokens, the {c.n_requests} logged requests "
            f"{b.tokens_predicted}: "
            "its counters run since it started and include other requests; compare with send=True (--send) to count "
            "only these"
        )
    if a.draft_tokens == 0 and b.draft_tokens > 0:
        out.append(
            f"the server drafted nothing while specviz's {cfg.strategy} drafted {b.draft_tokens} tokens: the server "
            "runs without speculative decoding (check its --spec-type)"
        )
        return out
    if b.draft_tokens == 0 and a.draft_tokens > 0:
        out.append(
            f"the server drafted {a.draft_tokens} tokens, specviz's reproduction none: pass the server's command line "
            "(server_args) so specviz drafts with its --spec-type"
        )
        return out
    # a text that parted explains the counts that follow it: said first, and the other findings say so
    parted = bool(c.parted) and c.temperature == 0
    if parted:
        shown = ", ".join(c.parted[:5]) + (" …" if len(c.parted) > 5 else "")
        out.append(
            f"the text of {len(c.parted)} of {c.n_requests} requests ({shown}) parts from the server's at temperature "
            "0: a greedy output parts at a near-tie when the target's numerics differ (flash attention, -b/-ub, "
            "the KV cache types, the server's prompt cache; see specviz verify), and those requests' drafts and "
            "acceptance differ with their text"
        )
    if _differs(a.prompt_tokens, b.prompt_tokens):
        out.append(
            f"the prompts differ in length (server {a.prompt_tokens} tokens, specviz {b.prompt_tokens}): the chat "
            "template — the server applies the model's Jinja template, specviz llama.cpp's built-in formatter "
            "(give --chat-template NAME to both)"
        )
    if c.temperature > 0:
        out.append(
            f"the requests were sampled (temperature {c.temperature:g}): accepted tokens differ from run to run; "
            "compare at temperature 0 for counts that must agree"
        )
    if _differs(a.mean_draft_length, b.mean_draft_length):
        out.append(
            f"the server drafts {a.mean_draft_length:.2f} tokens per step, specviz {b.mean_draft_length:.2f}: "
            + ("the parted texts above draw other drafts, or the " if parted else "the ")
            + "draft-length settings differ ("
            + (
                "give the server's command line, server_args, so specviz uses its --spec-* flags"
                if not cfg.argv
                else "check --spec-draft-n-max, the type's size_m / n_max, and -n"
            )
            + ")"
        )
    if abs(a.acceptance - b.acceptance) > ACCEPTANCE_TOLERANCE:
        why = []
        s = cfg.settings
        if s.cache_type_k != "f16" or s.cache_type_v != "f16":
            why.append(
                f"the quantized KV cache (-ctk {s.cache_type_k} -ctv {s.cache_type_v}) changes the target's "
                "logits, and near-ties then go another way"
            )
        if cfg.strategy in ("ngram-mod", "ngram-cache") and c.n_requests > 1:
            why.append(
                f"llama-server keeps {cfg.strategy}'s statistics across requests, specviz starts each request "
                "afresh: the server's later requests draft from what earlier ones left"
            )
        if (a.busy_slots_per_decode or 0.0) > 1.0 + COUNT_TOLERANCE:
            why.append(
                f"the server decoded {a.busy_slots_per_decode:.2f} busy slots per decode (requests served together "
                "in one batch, specviz's one at a time): a batch's composition changes the target's numerics at "
                "near-ties"
            )
        if not why:
            why.append(
                "flash attention and the batch sizes change the target's numerics at near-ties (-fa, -b, -ub); "
                "run specviz with the server's command line"
            )
        out.append(f"acceptance differs: server {a.acceptance:.1%}, specviz {b.acceptance:.1%}; " + "; ".join(why))
    pa, pb = a.per_position(), b.per_position()
    for i in range(min(len(pa), len(pb))):
        if abs(pa[i] - pb[i]) > max(ACCEPTANCE_TOLERANCE, 0.05):
            out.append(
                f"from draft position {i} on the per-position acceptance parts (server {pa[i]:.1%}, specviz "
                f"{pb[i]:.1%})"
                + ("" if abs(a.acceptance - b.acceptance) > ACCEPTANCE_TOLERANCE else ": deep drafts are cut otherwise")
            )
            break
    return out
