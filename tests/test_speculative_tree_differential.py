"""Differential test of the ``draft`` strategy against llama.cpp's draft-tree example, ``llama-speculative``.

``llama-speculative`` (``examples/speculative``, built by ``make llama-tools`` from the llama.cpp that
llama-cpp-python vendors; :mod:`specviz.analysis.llama_speculative`) runs the embedded Gemma 3 270M with a
draft derived from it (its first 17 of 18 layers) greedily, with ``-np 3``, ``--spec-draft-p-split 0.1`` and
``--spec-draft-n-max 8``; a specviz session runs the same target and draft with the ``draft`` strategy as a
chain: ``draft_max`` 8, ``draft_p_min`` 0, alignment off, the ``fixed`` policy. The generated text, the
tokens committed and the drafted and accepted totals must be equal, and the run must draft, accept and
reject, so it cannot pass vacuously.

What is matched, and why each is needed (``examples/speculative/speculative.cpp``):

* **No branch, though ``-np 3``.** Under ``--temp 0`` the tool's draft sampler keeps the top logit alone,
  so every other candidate's probability is 0 and never above ``p_split``: the tool drafts a chain. Its
  verbose log, which has a ``splitting seq`` line per split, has none (asserted).
* **Prompt layout.** The tool evaluates the prompt on the target as all but its last token, then the last
  token alone, and takes the first generated token from that row with no draft; its draft model reads the
  whole prompt in one batch. The session (prefill ``all-but-last``) runs its first round with the ``none``
  strategy (the last prompt token alone, no draft), then switches to ``draft``, whose drafter begins by
  reading the whole prompt in one batch: every target batch and the draft's prompt batch are the same.
  The batches matter: the model is Q4_K_M, whose CPU kernels for one row and for several need not round
  alike, so a different layout could move a near tie.
* **Draft length.** The tool drafts until its target batch holds more than ``n_draft`` rows after the pending
  token: exactly 8 tokens every round, never cut by ``p_min`` (it has none: ``draft_p_min`` 0) or by the
  remaining budget (the session's ``max_tokens`` is far above ``-n``, so its budget never cuts either).
* **Stopping.** The tool stops after the round in which its committed count exceeds ``-n`` (it overshoots
  by up to a round); the session is stepped while it has committed ``-n`` tokens or fewer, the same rule.
* **Counters.** The tool's ``n_drafted`` counts draft decode steps, one per depth; for a chain that is the
  tokens drafted, the session's ``drafted``. ``n_accept`` and ``n_predict`` are the accepted and committed
  tokens.
* **Context.** The tool opens its contexts with 3 sequences and no unified cache, so each sequence has
  ``n_ctx / 3`` positions; the tool gets ``3 × 512`` and the session 512. Cells past a sequence's length are
  masked out of attention, so the sizes change no number.

What stays different, and why it changes no count here: the tool decodes the draft's 8th token (whose row
it never reads) as it drafts; the session does not, and after a round that accepted all 8 it feeds that
token and the target's next one to the draft in one batch of two where the tool fed them one at a time.
Only the draft's rows depend on that, the drafted and accepted counts would move only if it flipped one of
the draft's picks, and the equal totals below show it did not on this run.

:func:`run_both`, :func:`run_session` and :func:`draft_knobs` take ``tree_width`` and ``p_split``: the hook
for the tree case (issue 56). Note for that case: specviz's greedy tree splits where the draft's rank-f
softmax probability is above ``p_split``, while the tool under ``--temp 0`` never splits, so a greedy
tree's drafted and accepted counts cannot equal the tool's; its text can, up to where each stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from native_util import native_tool

from specviz import Session
from specviz.analysis.llama_speculative import (
    TOOL,
    SpeculativeReport,
    parse_speculative_report,
    run_speculative,
    speculative_command,
)
from specviz.backends import LlamaModel

PROMPT = "The capital of France is"
N_PREDICT = 48
N_PARALLEL = 3  # the tool's -np: its most branches
P_SPLIT = 0.1  # the tool's default --spec-draft-p-split
DRAFT_MAX = 8  # --spec-draft-n-max and draft_max
N_CTX_SEQ = 512  # the session's context, and each of the tool's sequences'
THREADS = 1


@dataclass
class SessionRun:
    """What a session printed and counted, as the tool reports it."""

    text: bytes  # the prompt's and the generated tokens' pieces, BOS included, as the tool prints them
    n_predict: int
    drafted: int
    accepted: int
    tree: dict[str, int]  # the telemetry's tree figures


@pytest.fixture(scope="module")
def derived_draft(embedded_model_path, tmp_path_factory) -> Path:
    """The embedded model without its last layer: a draft that is often right and sometimes wrong."""
    from specviz.models.derive import derive_draft

    return derive_draft(embedded_model_path, "0-16", tmp_path_factory.mktemp("tree") / "draft-0-16.gguf").path


def draft_knobs(draft: Path, *, tree_width: int, p_split: float) -> dict[str, Any]:
    """The ``draft`` strategy's knobs for ``llama-speculative --spec-draft-n-max 8`` at ``tree_width`` branches
    (1: a chain) and ``p_split``. The tree knobs (issue 56) are passed only for a tree (``tree_width`` > 1),
    so the chain case runs the ``draft`` strategy exactly as before trees."""
    knobs: dict[str, Any] = {
        "draft_model": str(draft),
        "draft_max": DRAFT_MAX,
        "draft_p_min": 0.0,  # the tool has no p_min
        "align": False,
        "draft_policy": "fixed",
    }
    if tree_width > 1:
        knobs.update(tree_width=tree_width, p_split=p_split)
    return knobs


def run_session(model: LlamaModel, draft: Path, *, tree_width: int, p_split: float) -> SessionRun:
    """A greedy session laid out and stopped as the tool runs (see the module docstring); a tree's context holds
    a sequence per branch."""
    s = Session(model, n_ctx=N_CTX_SEQ, n_batch=512, n_ubatch=512, n_threads=THREADS, n_seq_max=tree_width)
    try:
        s.start(PROMPT, max_tokens=N_PREDICT + 2048, strategy="none")
        s.step()  # the last prompt token alone: the first token, undrafted
        s.configure(strategy="draft", **draft_knobs(draft, tree_width=tree_width, p_split=p_split))
        while s.finished is None and len(s.tokens) <= N_PREDICT:
            s.step()
        t = s.telemetry_dict()
        text = b"".join(model.piece_bytes(tok) for tok in s.history)
        return SessionRun(
            text=text, n_predict=len(s.tokens), drafted=t["drafted"], accepted=t["accepted"], tree=t["tree"]
        )
    finally:
        s.close()


def run_both(
    target: Path,
    draft: Path,
    *,
    tree_width: int,
    p_split: float,
    n_parallel: int,
    session_p_split: float | None = None,
) -> tuple[SpeculativeReport, SessionRun]:
    """``llama-speculative -np n_parallel --spec-draft-p-split p_split`` and a session of ``tree_width``
    branches on the same target, draft and prompt (its ``p_split``: ``session_p_split`` where given)."""
    report = run_speculative(
        native_tool(TOOL),
        target,
        draft,
        PROMPT,
        n_predict=N_PREDICT,
        n_parallel=n_parallel,
        p_split=p_split,
        draft_max=DRAFT_MAX,
        threads=THREADS,
        n_ctx=n_parallel * N_CTX_SEQ,
        verbose=True,
    )
    model = LlamaModel(target)
    try:
        split = p_split if session_p_split is None else session_p_split
        return report, run_session(model, draft, tree_width=tree_width, p_split=split)
    finally:
        model.close()


@pytest.mark.tools
@pytest.mark.slow
@pytest.mark.embedded
def test_greedy_chain_equals_llama_speculative(embedded_model_path, derived_draft):
    report, run = run_both(embedded_model_path, derived_draft, tree_width=1, p_split=P_SPLIT, n_parallel=N_PARALLEL)
    assert report.splits == 0, "llama-speculative split a branch under --temp 0"
    assert report.n_draft == DRAFT_MAX
    assert report.output.startswith(b"\n\n" + run.text + b"\n\n"), "the generated text differs"
    assert (run.n_predict, run.drafted, run.accepted) == (report.n_predict, report.n_drafted, report.n_accept)
    assert report.n_predict > N_PREDICT  # it stopped past -n, as both do
    assert report.n_drafted > report.n_accept > 0  # it drafted, accepted and rejected


@pytest.mark.tools
@pytest.mark.slow
@pytest.mark.embedded
def test_a_tree_that_cannot_split_equals_llama_speculative(embedded_model_path, derived_draft):
    # -np 3 on both sides, the session's target and draft opened with three sequences in one unified cache and
    # every round drafted by the tree drafter; under --temp 0 the tool never splits, and p_split 1 (no
    # probability exceeds it) keeps the session from splitting: the same rounds, token for token
    report, run = run_both(
        embedded_model_path,
        derived_draft,
        tree_width=N_PARALLEL,
        p_split=P_SPLIT,
        n_parallel=N_PARALLEL,
        session_p_split=1.0,
    )
    assert report.splits == 0 and run.tree["rounds_with_branches"] == 0
    assert report.output.startswith(b"\n\n" + run.text + b"\n\n"), "the generated text differs"
    assert (run.n_predict, run.drafted, run.accepted) == (report.n_predict, report.n_drafted, report.n_accept)


@pytest.mark.tools
@pytest.mark.slow
@pytest.mark.embedded
def test_a_greedy_tree_writes_llama_speculatives_text(embedded_model_path, derived_draft):
    # the same -np 3 and --spec-draft-p-split 0.1: the session's greedy tree splits where the draft's rank-f
    # probability (softmax at temperature 1) is above 0.1, the tool's never does (its temperature-0 draft
    # distribution is a point mass), so the drafted and accepted counts differ by design; both are greedy and
    # lossless, so the text is the same up to where the shorter run stopped
    report, run = run_both(embedded_model_path, derived_draft, tree_width=N_PARALLEL, p_split=P_SPLIT, n_parallel=3)
    assert report.splits == 0
    assert run.tree["rounds_with_branches"] > 0 and run.tree["max_branches"] > 1
    tool = report.output.removeprefix(b"\n\n")
    common = min(len(tool), len(run.text))
    assert run.text[:common] == tool[:common], "the generated text differs"
    assert common > len(PROMPT) + 40


#: The end of a verbose run's log as the tool prints it (timestamps and levels before each line).
VERBOSE_LOG = """0.01.000.001 D splitting seq   0 into   1
0.01.000.002 D splitting seq   1 into   2
0.07.748.407 I decoded   52 tokens in    4.384 seconds, speed:   11.861 t/s
0.07.748.408 I n_draft   = 8
0.07.748.408 I n_predict = 52
0.07.748.408 I n_drafted = 104
0.07.748.409 I n_accept  = 38
0.07.748.409 I accept    = 36.538%
"""


def test_the_report_is_read_from_a_verbose_log():
    r = parse_speculative_report(b"\n\nhi\n\n", VERBOSE_LOG, verbose=True)
    assert (r.n_draft, r.n_predict, r.n_drafted, r.n_accept, r.splits) == (8, 52, 104, 38, 2)
    assert (r.decode_seconds, r.decode_tokens_per_second) == (4.384, 11.861)
    assert parse_speculative_report(b"", VERBOSE_LOG).splits is None  # not verbose: splits not counted


def test_a_log_without_a_counter_is_refused():
    with pytest.raises(ValueError, match="printed no n_accept"):
        parse_speculative_report(b"", VERBOSE_LOG.replace("n_accept  = 38", "n_accept  ="))


def test_the_command_names_the_tree_options():
    cmd = speculative_command(
        "tool", "t.gguf", "d.gguf", "a b", n_predict=5, n_parallel=3, p_split=0.1, draft_max=8, threads=2, n_ctx=96
    )
    opts = dict(zip(cmd[1::2], cmd[2::2]))  # every option before --swa-full takes one value
    assert opts["-md"] == "d.gguf" and opts["-np"] == "3" and opts["--temp"] == "0"
    assert opts["--spec-draft-p-split"] == "0.1" and opts["--spec-draft-n-max"] == "8"
    assert cmd[-2:] == ["--swa-full", "--no-escape"]
