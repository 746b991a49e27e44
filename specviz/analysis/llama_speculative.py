"""Running llama.cpp's draft-tree example, ``llama-speculative``, for comparisons with specviz.

``llama-speculative`` (``examples/speculative``, built by ``make llama-tools`` from the llama.cpp source that
llama-cpp-python vendors) is the only drafter in llama.cpp that verifies a tree: up to ``-np`` draft
branches, one split off wherever the draft model's candidate of rank 1, 2, … has a probability above
``--spec-draft-p-split``, all verified in one target batch through llama.cpp's sequence ids.
:func:`speculative_command` builds its command line, :func:`run_speculative` runs it and
:func:`parse_speculative_report` reads what it prints.

What its counters count (``examples/speculative/speculative.cpp``), which is not what
``llama-speculative-simple``'s do:

* ``n_draft`` is ``--spec-draft-n-max``; every round drafts until the target batch holds more than that many
  rows after the pending token (no ``p_min``, no cut by the remaining budget);
* ``n_drafted`` counts the draft model's decode steps, one per draft depth whatever the number of branches
  drafting at that depth (for a chain: the tokens drafted);
* ``n_accept`` counts the draft tokens accepted, ``n_predict`` the tokens committed;
* the prompt is evaluated by the target as all its tokens but the last, then the last alone, and the first
  token comes from that row with no draft; the draft model reads the whole prompt at once;
* the loop stops after the round in which ``n_predict`` exceeds ``-n`` (or an end-of-generation token), so it
  overshoots ``-n`` by up to a round.

Under ``--temp 0`` its draft sampler leaves a point mass (the temperature sampler keeps the top logit only,
so every other candidate's probability is 0): no candidate of rank 1 or more is above ``p_split``, so no
branch ever splits and the tool drafts a chain. With ``verbose`` the tool logs one ``splitting seq`` line per
split; :attr:`SpeculativeReport.splits` counts them.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

TOOL = "llama-speculative"


@dataclass
class SpeculativeReport:
    """What one run of ``llama-speculative`` printed."""

    output: bytes  # stdout: two newlines, the prompt and the generated text as the tool rendered them, two newlines
    n_draft: int  # --spec-draft-n-max as the tool read it
    n_predict: int  # tokens committed
    n_drafted: int  # the draft model's decode steps (one per draft depth; a chain's drafted tokens)
    n_accept: int  # draft tokens accepted
    decode_seconds: float
    decode_tokens_per_second: float
    splits: int | None = None  # "splitting seq" lines (a branch split off); None: not run verbose
    log: str = ""  # stderr


_COUNTER_NAMES = ("n_draft", "n_predict", "n_drafted", "n_accept")
_COUNTERS = {name: re.compile(rf"^.*\b{name}\s*=\s*(\d+)\s*$", re.M) for name in _COUNTER_NAMES}
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds, speed:\s+([0-9.]+|inf|nan) t/s")
_SPLIT = re.compile(r"splitting seq\s+\d+ into\s+\d+")


def parse_speculative_report(stdout: bytes, stderr: str, *, verbose: bool = False) -> SpeculativeReport:
    """Read the counters and the decode time from the tool's output (``verbose``: also count its splits);
    ``ValueError`` when one is missing."""
    counts = {}
    for name, rx in _COUNTERS.items():
        found = rx.findall(stderr)  # the last: the summary comes after everything a verbose run logs
        if not found:
            raise ValueError(f"{TOOL} printed no {name}; its log ends with:\n{stderr[-2000:]}")
        counts[name] = int(found[-1])
    m = _DECODED.search(stderr)
    if m is None:
        raise ValueError(f"{TOOL} printed no decode time; its log ends with:\n{stderr[-2000:]}")
    return SpeculativeReport(
        output=stdout,
        decode_seconds=float(m.group(2)),
        decode_tokens_per_second=float(m.group(3)),
        splits=len(_SPLIT.findall(stderr)) if verbose else None,
        log=stderr,
        **counts,
    )


def speculative_command(
    binary: str | Path,
    target: str | Path,
    draft: str | Path,
    prompt: str,
    *,
    n_predict: int,
    n_parallel: int,
    p_split: float,
    draft_max: int,
    threads: int,
    n_ctx: int,
    n_batch: int = 512,
    n_ubatch: int = 512,
    verbose: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line that runs ``llama-speculative`` greedily (``--temp 0``) on ``prompt``: ``target``
    with ``draft`` (``-md``), ``n_parallel`` branches at most (``-np``), ``p_split``
    (``--spec-draft-p-split``) and ``draft_max`` (``--spec-draft-n-max``); the prompt passed byte for byte
    (``-p`` and ``--no-escape``), both contexts with a full sliding-window cache (``--swa-full``) as specviz's,
    and the draft model on the same threads as the target.

    The tool opens both contexts with ``n_parallel`` sequences and no unified cache, so each sequence has
    ``n_ctx / n_parallel`` positions of its own."""
    t = str(threads)
    return [
        str(binary),
        "-m",
        str(target),
        "-md",
        str(draft),
        "-p",
        prompt,
        "-n",
        str(n_predict),
        "--temp",
        "0",
        "-np",
        str(n_parallel),
        "--spec-draft-p-split",
        repr(float(p_split)),
        "--spec-draft-n-max",
        str(draft_max),
        "-t",
        t,
        "-tb",
        t,
        "-td",
        t,
        "-tbd",
        t,
        "-c",
        str(n_ctx),
        "-b",
        str(n_batch),
        "-ub",
        str(n_ubatch),
        "--swa-full",
        "--no-escape",
        *(["-v"] if verbose else []),
        *extra,
    ]


def run_speculative(
    binary: str | Path,
    target: str | Path,
    draft: str | Path,
    prompt: str,
    *,
    timeout: float = 600.0,
    attempts: int = 10,
    **options: Any,
) -> SpeculativeReport:
    """Run ``llama-speculative`` as :func:`speculative_command` says (``options``: its keyword arguments) and
    read its report.

    specviz's build links the tool with ``tools/native/flush-log-at-exit.cpp``, so its counters, logged last
    through llama.cpp's log queue, are never lost; a tool built elsewhere (``SPECVIZ_LLAMA_TOOLS``) may lose
    them at exit (see :func:`specviz.analysis.native.run_tool`), so a run whose report is incomplete is
    repeated, up to ``attempts`` times."""
    cmd = speculative_command(binary, target, draft, prompt, **options)
    for attempt in range(attempts):
        res = subprocess.run(cmd, capture_output=True, timeout=timeout)
        stderr = res.stderr.decode("utf-8", "replace")
        if res.returncode != 0:
            raise RuntimeError(f"{TOOL} exited with status {res.returncode}:\n{stderr[-3000:]}")
        try:
            return parse_speculative_report(res.stdout, stderr, verbose=bool(options.get("verbose")))
        except ValueError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
