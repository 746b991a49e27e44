"""Running llama.cpp's own speculative tool, ``llama-speculative-simple``, for comparisons with specviz.

The differential tests (``tests/test_differential.py``) and ``benchmarks/bench_native.py`` run the tool
built from the llama.cpp source that llama-cpp-python vendors (``make llama-tools``) on the same model,
prompt, strategy and knobs as a specviz session, and compare what it prints: the generated text, the
drafted and accepted counts, and the decode speed.

:func:`tool_args` maps a specviz strategy and its knobs to the tool's ``--spec-*`` options: the draftless
types, the model drafters (``draft``, ``eagle3``, ``mtp``, ``dflash``, ``dspark``: ``-md``,
``--spec-draft-p-min`` and ``--spec-draft-n-max``) and chains of them (one ``--spec-type`` list, each
member's options). ``prompt-lookup`` has no counterpart in llama.cpp; ``ngram-cache`` has no options there
(upstream drafts up to 8 tokens), so only ``n_draft=8`` maps.

The tool's generation loop differs from a specviz session in two ways that matter when comparing
counts (see ``examples/speculative-simple/speculative-simple.cpp``):

* it stops only once it has generated *more* than ``-n`` tokens, so it overshoots; and each round's draft
  is cut to the remaining budget minus one only while that is positive — in the last rounds the draft is
  not cut at all;
* its context cap is ``n_ctx - n_past - 2`` (one less than specviz's).

:func:`tool_draft_cap` gives the tool's cap for a round, so a session can be driven to the same batches.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

#: specviz knob -> the tool's option, per strategy (the draftless types llama.cpp has).
TOOL_OPTIONS: dict[str, dict[str, str]] = {
    "ngram-simple": {"size_n": "--spec-ngram-simple-size-n", "size_m": "--spec-ngram-simple-size-m"},
    "ngram-map-k": {
        "size_n": "--spec-ngram-map-k-size-n",
        "size_m": "--spec-ngram-map-k-size-m",
        "min_hits": "--spec-ngram-map-k-min-hits",
    },
    "ngram-map-k4v": {
        "size_n": "--spec-ngram-map-k4v-size-n",
        "size_m": "--spec-ngram-map-k4v-size-m",
        "min_hits": "--spec-ngram-map-k4v-min-hits",
    },
    "ngram-mod": {
        "n_match": "--spec-ngram-mod-n-match",
        "n_min": "--spec-ngram-mod-n-min",
        "n_max": "--spec-ngram-mod-n-max",
    },
    "ngram-cache": {},
}
#: The model drafters' options (one draft model, one ``--spec-draft-*`` set, as llama.cpp has).
_MODEL_OPTIONS = {"draft_model": "-md", "draft_p_min": "--spec-draft-p-min", "draft_max": "--spec-draft-n-max"}
for _name in ("draft", "eagle3", "mtp", "dflash", "dspark"):
    TOOL_OPTIONS[_name] = dict(_MODEL_OPTIONS)

#: Knobs that must keep a fixed value for the tool to draft as specviz does (the tool has no option).
TOOL_FIXED: dict[str, dict[str, Any]] = {
    "ngram-simple": {"check_rate": 1},
    "ngram-map-k": {"check_rate": 1},
    "ngram-map-k4v": {"check_rate": 1},
    "ngram-mod": {"pool_size": 4 * 1024 * 1024, "low_accept_ratio": 0.25, "low_accept_streak": 5},
    "ngram-cache": {"n_draft": 8},
}


def tool_args(strategy: str, knobs: dict[str, Any]) -> list[str]:
    """``--spec-type`` and the ``--spec-*`` options that give ``strategy`` with ``knobs`` in the tool (a chain:
    its members' types in one list, each member's options from its part of the chain's knobs).

    Raises ``ValueError`` for a strategy the tool does not have or a knob value it cannot express.
    """
    from ..strategies import resolve_strategy, spec_type, strategy_class

    canonical = resolve_strategy(strategy)
    members = canonical.split(",")
    missing = [m for m in members if m not in TOOL_OPTIONS]
    if missing:
        raise ValueError(f"llama-speculative-simple has no type {missing[0]!r}; it has {', '.join(TOOL_OPTIONS)}")
    cls = strategy_class(canonical)
    names: dict[str, dict[str, str]] = getattr(cls, "member_knobs", {canonical: {k: k for k in knobs}})
    args = ["--spec-type", spec_type(canonical) or canonical]
    seen: set[str] = set()
    for m in members:
        own = {mine: knobs[chain] for mine, chain in names.get(m, {}).items() if chain in knobs}
        if "draft_max" in knobs and "draft_max" in TOOL_OPTIONS[m]:  # a session knob: a model type's --spec-draft-n-max
            own["draft_max"] = knobs["draft_max"]
        for name, value in TOOL_FIXED.get(m, {}).items():
            if name in own and own[name] != value:
                raise ValueError(
                    f"llama-speculative-simple cannot run {m} with {name}={own[name]!r} (it always uses {value!r})"
                )
        for name, option in TOOL_OPTIONS[m].items():
            if name in own and option not in seen and own[name] != "":  # no -md: the target's own layers
                seen.add(option)
                v = own[name]
                args += [option, str(v) if isinstance(v, (str, float)) else str(int(v))]
    return args


def tool_draft_cap(n_ctx: int, n_past: int, n_predict: int, n_generated: int) -> int | None:
    """The tool's cap on a round's draft, or ``None`` where it does not cut the draft.

    ``n_past`` is the number of positions in the target's cache before the round (the history minus its
    pending last token), ``n_generated`` the tokens generated so far.
    """
    cap = min(n_ctx - n_past - 2, n_predict - n_generated - 1)
    return cap if cap > 0 else None


@dataclass
class ToolReport:
    """What one run of ``llama-speculative-simple`` printed."""

    output: bytes  # stdout: the prompt and the generated text, as the tool rendered them
    n_predict: int  # tokens generated (llama.cpp's n_predict counter)
    n_drafted: int  # draft tokens verified
    n_accept: int  # draft tokens accepted
    decode_seconds: float
    decode_tokens_per_second: float
    log: str = ""  # stderr


_COUNTERS = {name: re.compile(rf"^.*{name}\s*=\s*(\d+)\s*$", re.M) for name in ("n_predict", "n_drafted", "n_accept")}
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds, speed:\s+([0-9.]+|inf|nan) t/s")


def parse_report(stdout: bytes, stderr: str) -> ToolReport:
    """Read the counters and the decode time from the tool's output; ``ValueError`` when one is missing."""
    counts = {}
    for name, rx in _COUNTERS.items():
        m = rx.search(stderr)
        if m is None:
            raise ValueError(f"llama-speculative-simple printed no {name}; its log ends with:\n{stderr[-2000:]}")
        counts[name] = int(m.group(1))
    m = _DECODED.search(stderr)
    if m is None:
        raise ValueError(f"llama-speculative-simple printed no decode time; its log ends with:\n{stderr[-2000:]}")
    return ToolReport(
        output=stdout,
        decode_seconds=float(m.group(2)),
        decode_tokens_per_second=float(m.group(3)),
        log=stderr,
        **counts,
    )


def tool_command(
    binary: str | Path,
    model: str | Path,
    prompt: str,
    strategy: str,
    knobs: dict[str, Any],
    *,
    n_predict: int,
    threads: int,
    n_ctx: int,
    n_batch: int = 512,
    n_ubatch: int = 512,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line that runs ``llama-speculative-simple`` greedily on ``prompt``, byte for byte: passed
    with ``-p`` (``-f`` drops a trailing newline) and ``--no-escape`` (the tool would otherwise turn a
    backslash and ``n`` into a newline). The context keeps a full sliding-window cache (``--swa-full``), as
    specviz's does."""
    return [
        str(binary),
        "-m",
        str(model),
        "-p",
        prompt,
        "-n",
        str(n_predict),
        "--temp",
        "0",
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-c",
        str(n_ctx),
        "-b",
        str(n_batch),
        "-ub",
        str(n_ubatch),
        "--swa-full",
        "--no-escape",
        *tool_args(strategy, knobs),
        *extra,
    ]


def run_tool(
    binary: str | Path,
    model: str | Path,
    prompt: str,
    strategy: str,
    knobs: dict[str, Any],
    *,
    timeout: float = 600.0,
    attempts: int = 10,
    **options: Any,
) -> ToolReport:
    """Run ``llama-speculative-simple`` as :func:`tool_command` says (``options``: its keyword arguments,
    ``n_predict``, ``threads`` and ``n_ctx`` among them) and read its report.

    The tool logs through a queue that a background thread writes out, and upstream never shuts that
    logger down (llama.cpp issue 22142), so the last lines — the counters — can be lost when the process
    exits. specviz's build of the tool (``tools/build_llama_tools.sh``) flushes the queue at exit
    (``tools/native/flush-log-at-exit.cpp``); a tool built elsewhere (``SPECVIZ_LLAMA_TOOLS``) may still
    lose them, so a run whose report is incomplete is repeated, up to ``attempts`` times.
    """
    cmd = tool_command(binary, model, prompt, strategy, knobs, **options)
    for attempt in range(attempts):
        res = subprocess.run(cmd, capture_output=True, timeout=timeout)
        stderr = res.stderr.decode("utf-8", "replace")
        if res.returncode != 0:
            raise RuntimeError(f"llama-speculative-simple exited with status {res.returncode}:\n{stderr[-3000:]}")
        try:
            return parse_report(res.stdout, stderr)
        except ValueError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
