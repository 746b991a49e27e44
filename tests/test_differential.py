"""Differential tests: specviz's draftless strategies against llama.cpp's own, built from the same source.

Two levels, both against binaries built by ``make llama-tools`` from the llama.cpp that llama-cpp-python
vendors:

* **Drafts** — ``specviz-draft-replay`` runs llama.cpp's ``common_speculative`` implementations on the same
  calls as a specviz drafter (begin with the prompt, then per round draft and accept), on histories with
  repeated phrases, and every draft must be the same token for token.
* **Generations** — ``llama-speculative-simple`` generates greedily on a tiny f32 fixture (its batch and
  one-token logits agree to about 1e-6, so greedy output does not depend on the batch) and a specviz
  session is driven to the same batches: verify-tile alignment off, the ``fixed`` policy, and each round
  the tool's own draft cap (see :func:`specviz.analysis.native.tool_draft_cap`: the tool cuts a draft to the
  remaining budget minus one only while that is positive, and stops once it has generated *more* than
  ``-n`` tokens). The generated text, the number of tokens and the drafted and accepted counts must be
  equal.

Every case must draft, accept and reject, so none can pass vacuously.

Where specviz departs from llama.cpp on purpose (module docstrings of the strategies), the departure is
undone in the comparison where the rest can still be compared (ngram-cache: :class:`UpstreamNgramCache`)
or kept out of the compared cases (ngram-map-k's ``min_hits``; ngram-mod's rules when a round's cap cuts
the chain), and a test below shows a case where the two differ and specviz does what it documents.
"""

from __future__ import annotations

import numpy as np
import pytest
from native_util import Replay, UpstreamNgramCache, libstdcxx_order, native_tool, replay_rounds

import specviz.strategies as strategies
from specviz import Session
from specviz.analysis.native import parse_report, run_tool, tool_args, tool_command, tool_draft_cap
from specviz.backends import LlamaModel
from specviz.strategies import make_drafter, strategy_class, strategy_schema
from specviz.testing.tiny_models import write_tiny_llama


def structured(seed: int, n: int, alphabet: int = 12) -> list[int]:
    """A token sequence made of a few short phrases repeated in random order, with a little noise: keys
    recur with different continuations, so drafts are both accepted and rejected."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(3, 3 + alphabet, size=int(rng.integers(2, 7))).tolist() for _ in range(6)]
    out: list[int] = []
    while len(out) < n:
        if rng.random() < 0.15:
            out.append(int(rng.integers(3, 3 + alphabet)))
        else:
            out += phrases[int(rng.integers(len(phrases)))]
    return out[:n]


def drafter(strategy: str, knobs: dict):
    """specviz's drafter for ``strategy`` (ngram-cache with its departures undone, see the module docstring)."""
    if strategy == "ngram-cache":
        return UpstreamNgramCache(**knobs)
    return make_drafter(strategy, strategy_schema(strategy).validate(knobs))


# ------------------------------------------------------------------------------------------------------
# drafts: every round's draft equals llama.cpp's
# ------------------------------------------------------------------------------------------------------

WIDE = 64  # a round's cap above every draft length of these knobs: the drafter's own limits decide


def varying(r: int) -> int:
    """A cap that changes every round (1…7), cutting drafts as the end of a budget does."""
    return 1 + r % 7


DRAFT_CASES = [
    ("ngram-simple", {"size_n": 2, "size_m": 4}, WIDE),
    ("ngram-simple", {"size_n": 1, "size_m": 6}, WIDE),
    ("ngram-simple", {"size_n": 3, "size_m": 3}, varying),
    ("ngram-map-k", {"size_n": 2, "size_m": 4}, WIDE),
    ("ngram-map-k", {"size_n": 1, "size_m": 3}, WIDE),
    ("ngram-map-k", {"size_n": 3, "size_m": 8}, varying),
    ("ngram-map-k4v", {"size_n": 2, "size_m": 3}, WIDE),
    ("ngram-map-k4v", {"size_n": 1, "size_m": 2}, WIDE),
    ("ngram-map-k4v", {"size_n": 2, "size_m": 4, "min_hits": 2}, WIDE),
    ("ngram-map-k4v", {"size_n": 3, "size_m": 8, "min_hits": 3}, varying),
    # ngram-mod with caps of at least n_max: a cap below the chain is where specviz departs (tests below)
    ("ngram-mod", {"n_match": 2, "n_min": 1, "n_max": 8}, WIDE),
    ("ngram-mod", {"n_match": 3, "n_min": 2, "n_max": 6}, WIDE),
    ("ngram-mod", {"n_match": 4, "n_min": 4, "n_max": 16}, WIDE),
    ("ngram-cache", {}, WIDE),
    ("ngram-cache", {}, varying),
]


@pytest.mark.parametrize(
    "strategy,knobs,cap",
    DRAFT_CASES,
    ids=[f"{s}-{'-'.join(f'{k}{v}' for k, v in kn.items())}-{getattr(c, '__name__', c)}" for s, kn, c in DRAFT_CASES],
)
@pytest.mark.tools
def test_every_draft_equals_llama_cpps(strategy, knobs, cap):
    native_tool("specviz-draft-replay")
    drafted = accepted = rejected_rounds = 0
    for seed in range(8):
        seq = structured(seed, 360, alphabet=(8, 12, 30)[seed % 3])
        rep = replay_rounds(drafter(strategy, knobs), strategy, knobs, [1] + seq[:60], seq[60:], n_max=cap)
        first = rep.first_difference()
        assert first is None, f"seed {seed}: {rep.describe(first)}"
        assert len(rep.specviz) > 20
        drafted += sum(len(d) for d in rep.specviz)
        accepted += sum(rep.accepted)
        rejected_rounds += sum(1 for d, a in zip(rep.specviz, rep.accepted) if a < len(d))
    assert accepted > 50 and rejected_rounds > 20 and drafted > accepted


# ------------------------------------------------------------------------------------------------------
# generations: llama-speculative-simple and a session driven to the same batches
# ------------------------------------------------------------------------------------------------------

N_CTX = 1024
N_PREDICT = 80

#: (fixture seed, block_scale, prompt start): the prompt is the start plus the fixture's own greedy
#: continuation, so the generation goes on repeating what the prompt holds and every strategy drafts.
FIXTURES = {"digits": (6, 0.1, "1, 2, 3, 4, 5, 6"), "code": (3, 0.1, "def add(a, b): return a + b")}

GENERATION_CASES = [
    ("ngram-simple", {"size_n": 2, "size_m": 4}),
    ("ngram-simple", {"size_n": 1, "size_m": 8}),
    ("ngram-simple", {"size_n": 3, "size_m": 16}),
    ("ngram-map-k", {"size_n": 2, "size_m": 4}),
    ("ngram-map-k", {"size_n": 1, "size_m": 6}),
    ("ngram-map-k", {"size_n": 3, "size_m": 12}),
    ("ngram-map-k4v", {"size_n": 2, "size_m": 4}),
    ("ngram-map-k4v", {"size_n": 1, "size_m": 3}),
    ("ngram-map-k4v", {"size_n": 2, "size_m": 8, "min_hits": 2}),
    ("ngram-mod", {"n_match": 2, "n_min": 1, "n_max": 8}),
    ("ngram-mod", {"n_match": 3, "n_min": 2, "n_max": 12}),
    ("ngram-mod", {"n_match": 4, "n_min": 4, "n_max": 32}),
    ("ngram-cache", {}),
]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """name -> (model path, loaded model, prompt)."""
    out = {}
    for name, (seed, block_scale, start) in FIXTURES.items():
        path = write_tiny_llama(tmp_path_factory.mktemp("diff") / f"{name}.gguf", seed=seed, block_scale=block_scale)
        model = LlamaModel(path)
        s = Session(model, n_ctx=N_CTX, n_threads=1)
        s.start(start, max_tokens=60, strategy="none")
        s.run()
        prompt = (start + s.text).replace("\x00", "")  # a prompt travels as a command-line argument
        s.close()
        out[name] = (path, model, prompt)
    yield out
    for _, model, _ in out.values():
        model.close()


def run_like_the_tool(
    model: LlamaModel, prompt: str, strategy: str, knobs: dict, n_predict: int, threads: int = 1
) -> Session:
    """A greedy session run to the batches ``llama-speculative-simple -n n_predict`` verifies."""
    s = Session(model, n_ctx=N_CTX, n_batch=512, n_ubatch=512, n_threads=threads)
    # no budget or draft_max of specviz's own may cut a draft: the tool's cap is set every round
    s.start(
        prompt,
        max_tokens=n_predict + 2048,
        strategy=strategy,
        draft_max=1024,
        align=False,
        draft_policy="fixed",
        **knobs,
    )
    while s.finished is None and len(s.tokens) <= n_predict:
        cap = tool_draft_cap(N_CTX, len(s.history) - 1, n_predict, len(s.tokens))
        s.configure(draft_max=cap if cap is not None else 1024)
        s.step()
    return s


@pytest.mark.parametrize("fixture", list(FIXTURES))
@pytest.mark.parametrize(
    "strategy,knobs",
    GENERATION_CASES,
    ids=[f"{s}-{'-'.join(f'{k}{v}' for k, v in kn.items())}" for s, kn in GENERATION_CASES],
)
@pytest.mark.tools
def test_generation_equals_llama_speculative_simple(fixtures, fixture, strategy, knobs, monkeypatch):
    tool = native_tool("llama-speculative-simple")
    if strategy == "ngram-cache":  # compare the rest; the departures are shown by the tests below
        monkeypatch.setitem(strategies._REGISTRY, "ngram-cache", "native_util:UpstreamNgramCache")
    path, model, prompt = fixtures[fixture]
    report = run_tool(tool, path, prompt, strategy, knobs, n_predict=N_PREDICT, threads=1, n_ctx=N_CTX)
    s = run_like_the_tool(model, prompt, strategy, knobs, N_PREDICT)
    t = s.telemetry_dict()
    expected_text = b"".join(model.piece_bytes(tok) for tok in s.history)
    s.close()
    assert report.output.startswith(b"\n\n" + expected_text + b"\n\n"), "the generated text differs"
    assert (len(s.tokens), t["drafted"], t["accepted"]) == (report.n_predict, report.n_drafted, report.n_accept)
    assert report.n_predict > N_PREDICT  # the tool's overshoot, reproduced
    assert report.n_drafted > report.n_accept > 0  # it drafted, accepted and rejected


@pytest.mark.parametrize("strategy,knobs", [("ngram-map-k4v", {"size_n": 2, "size_m": 4}), ("ngram-cache", {})])
@pytest.mark.tools
def test_generation_equals_llama_speculative_simple_with_two_threads(fixtures, strategy, knobs, monkeypatch):
    tool = native_tool("llama-speculative-simple")
    if strategy == "ngram-cache":
        monkeypatch.setitem(strategies._REGISTRY, "ngram-cache", "native_util:UpstreamNgramCache")
    path, model, prompt = fixtures["digits"]
    report = run_tool(tool, path, prompt, strategy, knobs, n_predict=N_PREDICT, threads=2, n_ctx=N_CTX)
    s = run_like_the_tool(model, prompt, strategy, knobs, N_PREDICT, threads=2)
    t = s.telemetry_dict()
    expected_text = b"".join(model.piece_bytes(tok) for tok in s.history)
    s.close()
    assert report.output.startswith(b"\n\n" + expected_text + b"\n\n")
    assert (len(s.tokens), t["drafted"], t["accepted"]) == (report.n_predict, report.n_drafted, report.n_accept)
    assert report.n_drafted > report.n_accept > 0


@pytest.mark.tools
def test_llama_cpps_draft_n_max_does_not_cap_ngram_drafts(fixtures):
    """llama.cpp's ``--spec-draft-n-max`` applies to model drafts only: its n-gram types draft up to their
    own ``size_m`` / ``n_max`` (ngram-cache 8). specviz's ``draft_max`` caps every strategy."""
    tool = native_tool("llama-speculative-simple")
    path, _, prompt = fixtures["digits"]
    knobs = {"size_n": 1, "size_m": 8}
    free = run_tool(tool, path, prompt, "ngram-simple", knobs, n_predict=N_PREDICT, threads=1, n_ctx=N_CTX)
    capped = run_tool(
        tool,
        path,
        prompt,
        "ngram-simple",
        knobs,
        n_predict=N_PREDICT,
        threads=1,
        n_ctx=N_CTX,
        extra=["--spec-draft-n-max", "2"],
    )
    assert (capped.n_drafted, capped.n_accept) == (free.n_drafted, free.n_accept)
    # whereas the type's own size does cap them
    short = run_tool(
        tool, path, prompt, "ngram-simple", dict(knobs, size_m=2), n_predict=N_PREDICT, threads=1, n_ctx=N_CTX
    )
    assert short.n_drafted < free.n_drafted


def test_tool_args_are_llama_cpps_spellings():
    assert tool_args("ngram-map-k4v", {"size_n": 3, "size_m": 8, "min_hits": 2, "check_rate": 1}) == [
        "--spec-type",
        "ngram-map-k4v",
        "--spec-ngram-map-k4v-size-n",
        "3",
        "--spec-ngram-map-k4v-size-m",
        "8",
        "--spec-ngram-map-k4v-min-hits",
        "2",
    ]
    assert tool_args("ngram-mod", {"n_match": 4, "n_min": 2, "n_max": 9}) == [
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-mod-n-match",
        "4",
        "--spec-ngram-mod-n-min",
        "2",
        "--spec-ngram-mod-n-max",
        "9",
    ]
    with pytest.raises(ValueError, match="n_draft"):
        tool_args("ngram-cache", {"n_draft": 5})  # upstream always drafts up to 8
    with pytest.raises(ValueError, match="prompt-lookup"):
        tool_args("prompt-lookup", {})


def test_the_tools_draft_cap():
    assert tool_draft_cap(1024, 40, 80, 10) == 69  # the remaining budget minus one
    assert tool_draft_cap(50, 40, 80, 10) == 8  # n_ctx - n_past - 2
    assert tool_draft_cap(1024, 40, 80, 79) is None  # not cut at all once it reaches 0
    assert tool_draft_cap(1024, 40, 80, 80) is None


# ------------------------------------------------------------------------------------------------------
# the departures: a case where specviz and llama.cpp differ, and specviz does what it documents
# ------------------------------------------------------------------------------------------------------


def native_draft(strategy: str, knobs: dict, history: list[int], n_max: int) -> list[int]:
    """llama.cpp's first draft after ``history`` (begin with it, then one draft)."""
    r = Replay(strategy, knobs)
    try:
        r.push(history[:-1])
        r.last(history[-1])
        r.begin()
        return r.draft(n_max)
    finally:
        r.close()


def first_draft(strategy: str, knobs: dict, history: list[int], n_max: int, cls=None) -> list[int]:
    d = (cls or strategy_class(strategy))(**knobs)
    d.begin(history)
    return list(d.draft(history, n_max).tokens)


@pytest.mark.tools
def test_ngram_map_k_honours_min_hits_which_llama_cpp_ignores():
    """llama.cpp's key-only path returns its draft before the min_hits check, so the option it documents
    for ngram-map-k does nothing; specviz waits for the key's second look-up."""
    h = [1, 5, 6, 7, 8, 9, 10, 11, 12, 5, 6]
    knobs = {"size_n": 2, "size_m": 3, "min_hits": 2}
    assert native_draft("ngram-map-k", knobs, h, 16) == [7, 8, 9]
    assert first_draft("ngram-map-k", knobs, h, 16) == []
    # with min_hits=1 they agree
    assert first_draft("ngram-map-k", dict(knobs, min_hits=1), h, 16) == [7, 8, 9]


@pytest.mark.tools
def test_ngram_mod_measures_low_acceptance_on_the_tokens_proposed():
    """A chain of 8 cut to 1 token that is accepted counts as 1/8 accepted upstream: five such rounds clear
    the pool (on a history shorter than 33 tokens it stays empty), while specviz counts 1/1."""
    knobs = {"n_match": 2, "n_min": 1, "n_max": 8}
    period = [20, 21, 22]
    rep = replay_rounds(drafter("ngram-mod", knobs), "ngram-mod", knobs, [1] + period * 4, period * 8, n_max=1)
    first = rep.first_difference()
    assert first == 5, rep.describe(first) if first is not None else "no difference"
    assert rep.accepted == [1] * 5  # five rounds of a 1-token draft, accepted
    assert rep.llama[5] == [] and len(rep.specviz[5]) == 1


@pytest.mark.tools
def test_ngram_mod_n_min_is_capped_by_the_rounds_limit():
    """When a round allows fewer tokens than n_min, a chain that fills the allowance is enough for specviz;
    llama.cpp still requires n_min tokens before it cuts the draft."""
    h = [1, 30, 31, 32, 10, 11, 12, 13, 10, 11]  # the chain from (10, 11) is 12, 13, 10, then nothing
    knobs = {"n_match": 2, "n_min": 4, "n_max": 8}
    assert native_draft("ngram-mod", knobs, h, 3) == []
    assert first_draft("ngram-mod", knobs, h, 3) == [12, 13, 10]
    # a round that allows n_min tokens: both refuse the 3-token chain
    assert native_draft("ngram-mod", knobs, h, 8) == first_draft("ngram-mod", knobs, h, 8) == []


@pytest.mark.tools
def test_ngram_cache_learns_n_grams_that_straddle_two_rounds():
    """llama.cpp updates its context statistics from each call's new tokens alone: when rounds commit one
    token each it learns nothing from the generated text. specviz counts every n-gram of the history."""
    prompt, truth = [1, 40, 41], [5, 6, 7] * 12
    cache = strategy_class("ngram-cache")
    rep = replay_rounds(cache(), "ngram-cache", {}, prompt, truth, n_max=8)
    first = rep.first_difference()
    assert first is not None and rep.llama[first] == [] and rep.specviz[first]
    assert all(a == 0 for a in rep.accepted)  # until then every round committed one token
    # the same rounds with the update undone match llama.cpp
    assert replay_rounds(UpstreamNgramCache(), "ngram-cache", {}, prompt, truth, n_max=8).first_difference() is None


@pytest.mark.tools
def test_ngram_cache_breaks_ties_by_first_appearance():
    """(5, 6, 7) was followed once by 20 and once by 9 (50% each passes for a 3-gram). specviz drafts the
    first seen, 20; llama.cpp the first its unordered_map meets, which with libstdc++ is 9."""
    h = [1, 5, 6, 7, 20, 5, 6, 7, 9, 30, 5, 6, 7]
    assert libstdcxx_order([20, 9]) == [9, 20]
    assert native_draft("ngram-cache", {}, h, 1) == [9]
    assert first_draft("ngram-cache", {}, h, 1) == [20]
    assert first_draft("ngram-cache", {}, h, 1, cls=UpstreamNgramCache) == [9]


# ------------------------------------------------------------------------------------------------------
# prompt-lookup: not a llama.cpp type; compared with llama-cpp-python's LlamaPromptLookupDecoding
# ------------------------------------------------------------------------------------------------------


def test_prompt_lookup_equals_llama_cpp_pythons_prompt_lookup_decoding():
    """On every prefix of histories with repeated phrases, specviz's prompt lookup (``min_ngram=1``)
    proposes what llama-cpp-python's ``LlamaPromptLookupDecoding`` proposes for the same input ids: sizes
    from ``max_ngram`` down, the earliest occurrence, up to ``n`` tokens and no further than the end."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    lookup = strategy_class("prompt-lookup")
    compared = nonempty = 0
    for seed in range(6):
        h = [1] + structured(seed, 120, alphabet=(6, 12, 40)[seed % 3])
        for max_ngram in (1, 2, 3, 5):
            for n in (1, 4, 10):
                theirs = LlamaPromptLookupDecoding(max_ngram_size=max_ngram, num_pred_tokens=n)
                ours = lookup(max_ngram=max_ngram, min_ngram=1)
                ours.begin(h[:1])
                for L in range(1, len(h) + 1):
                    got = ours.draft(h[:L], n).tokens
                    assert got == theirs(np.array(h[:L], dtype=np.intc)).tolist(), (seed, max_ngram, n, L)
                    compared += 1
                    nonempty += bool(got)
    assert nonempty > compared // 2


def test_prompt_lookup_min_ngram_is_specvizs_own():
    """llama-cpp-python always goes down to unigrams; with ``min_ngram`` above 1 specviz stops earlier."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    h = [4, 1, 9, 9, 5, 1]  # only the unigram [1] recurs
    theirs = LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=2)(np.array(h, dtype=np.intc)).tolist()
    assert theirs == [9, 9]
    d = strategy_class("prompt-lookup")(max_ngram=3, min_ngram=2)
    d.begin(h)
    assert d.draft(h, 2).tokens == []


@pytest.mark.tools
def test_bench_native_runs_and_prints_both_tables(tiny_model_path, capsys):
    """benchmarks/bench_native.py end to end on the tiny model (its figures mean nothing here)."""
    import importlib.util
    from pathlib import Path

    native_tool("llama-speculative-simple")
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_native.py"
    spec = importlib.util.spec_from_file_location("bench_native", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = [
        "--model",
        str(tiny_model_path),
        "--repeats",
        "1",
        "--max-tokens",
        "24",  # enough for ngram-cache to draft a full 8 on quote: what --lengths 2 must cut
        "--threads",
        "1",
        "--kinds",
        "quote,free",
        "--prompts",
        "0",
        "--strategies",
        "ngram-simple,ngram-cache",
        "--lengths",
        "2,16",
        "--json",
    ]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "| quote | ngram-simple |" in out and "| quote | ngram-cache |" in out
    assert "| free | none |" in out and "| free | ngram-cache |" in out
    assert "| free | ngram-simple | " in out.split("cost policy vs none")[1]
    import json

    raw = json.loads(out[out.index("\n{") :])
    cell = raw["runs"]["quote"]["0"]
    for strat in ("ngram-simple", "ngram-cache"):
        n_tool = cell[f"{strat}/native"][0]["tokens"]
        assert n_tool >= 24
        # what the first table compares with the tool decodes as many tokens as the tool did
        for side in ("same", "tile", "cost"):
            assert cell[f"{strat}/{side}@tool"][0]["tokens"] == n_tool, (strat, side)
            assert cell[f"{strat}/{side}"][0]["tokens"] == 24  # the second table's runs keep --max-tokens
    assert [r["tokens"] for r in raw["table"]] == [
        cell[f"{s}/native"][0]["tokens"] for s in ("ngram-simple", "ngram-cache")
    ]
    # --lengths: each strategy with the fixed policy at each length, as many tokens as the tool, drafts cut
    assert "draft length against llama-speculative-simple" in out
    for strat in ("ngram-simple", "ngram-cache"):
        n_tool = cell[f"{strat}/native"][0]["tokens"]
        for n in (2, 16):
            run = cell[f"{strat}/fixed-{n}@tool"][0]
            assert run["tokens"] == n_tool and run["longest_draft"] <= n, (strat, n, run)
    # ngram-cache drafts more than 2 tokens here when nothing cuts it, so the cut above is --lengths' doing
    assert cell["ngram-cache/fixed-16@tool"][0]["longest_draft"] > 2
    assert [(r["kind"], r["strategy"], sorted(map(int, r["ratios"]))) for r in raw["lengths"]] == [
        ("quote", "ngram-simple", [2, 16]),
        ("quote", "ngram-cache", [2, 16]),
    ]
    for r in raw["lengths"]:
        assert r["ratios"][str(r["best"])] == max(r["ratios"].values())
    # the priced speedup: every round's verify batch counted, none's all one row, and the figure worked
    # again from the JSON with the printed price list
    from specviz.decoding.verify_cost import VerifyCostModel

    prices = VerifyCostModel(raw["prices"]["sizes"], raw["prices"]["seconds"])
    for kind, cells in raw["runs"].items():
        for key, results in cells["0"].items():
            if key.endswith("/native"):
                continue
            for r in results:
                assert sum(r["batches"].values()) == r["rounds"], (kind, key, r)
                assert sum(int(b) * n for b, n in r["batches"].items()) == r["rounds"] + r["drafted"], (kind, key)
        assert set(cells["0"]["none/none"][0]["batches"]) == {"1"}

    def tps(r):
        return r["tokens"] / sum(prices(int(b)) * n for b, n in r["batches"].items())

    for row in raw["cost_vs_none"]:
        cell = raw["runs"][row["kind"]]["0"]
        want = tps(cell[f"{row['strategy']}/cost"][0]) / tps(cell["none/none"][0])
        assert row["priced"]["0"] == pytest.approx(want, rel=1e-12), row
        if cell[f"{row['strategy']}/cost"][0]["batches"] == cell["none/none"][0]["batches"]:
            assert row["priced"]["0"] == 1.0  # the policy drafted nothing: none's batches, none's price
    # hand-worked: one-row batches at 10 ms, four-row ones at 30 ms. none: 8 tokens in 8 rounds, 80 ms;
    # a cost run: 8 tokens in 2 one-row rounds and 2 four-row ones (each 2 of 3 accepted plus the target's
    # token), 80 ms too; another with one four-row round accepting 1 of 3 (2 tokens, 30 ms) and 6 one-row
    # ones (60 ms): 8 in 90 ms
    hand = VerifyCostModel([1, 4], [0.010, 0.030])
    assert bench.priced_seconds({"1": 2, "4": 2}, hand) == pytest.approx(0.080)
    none_runs = [{"tokens": 8, "batches": {"1": 8}}] * 3
    even = {"tokens": 8, "batches": {"1": 2, "4": 2}}
    losing = {"tokens": 8, "batches": {"1": 6, "4": 1}}
    assert bench.priced_speedup([even, losing, losing], none_runs, hand) == pytest.approx(80 / 90)
    assert bench.priced_speedup([even, even, losing], none_runs, hand) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lengths", "4,x"], "not a comma-separated list"),
        (["--lengths", "0,4"], "from 1 to 16"),
        (["--lengths", "17"], "from 1 to 16"),
        (["--lengths", "4", "--sides", "cost"], "leave --sides"),
    ],
)
def test_bench_native_refuses_bad_lengths_before_loading_anything(extra, message, capsys):
    """A bad --lengths is refused by name with what to give, before a model is loaded."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_native.py"
    spec = importlib.util.spec_from_file_location("bench_native", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit) as e:
        bench.main(["--model", "/nonexistent.gguf", *extra])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def _one_cpu_run_to_completion():
    """In the child, before exec: one CPU and the real-time FIFO policy. Threads of one FIFO priority are
    never preempted by each other, so the tool's main thread runs to its end unless it blocks, and its
    logging thread writes only what it gets to before the process exits."""
    import os

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))


@pytest.mark.tools
def test_the_tool_prints_its_counters_before_it_exits(tiny_model_path, tmp_path):
    """The tool's log queue is written out before the process ends (tools/native/flush-log-at-exit.cpp).

    Upstream never stops its logging thread, and a run on a tiny model is over in milliseconds, so the
    counters were lost now and then (10 runs in a row once in CI). On one CPU under the FIFO policy the
    logging thread runs only when the main thread waits for it: the unpatched tool lost its counters in
    20 runs of 20 so, the patched one in none.
    """
    import subprocess

    try:
        subprocess.run(["true"], check=True, preexec_fn=_one_cpu_run_to_completion)
    except (subprocess.SubprocessError, OSError) as e:
        pytest.skip(f"this machine refuses the real-time FIFO policy to a child process (CAP_SYS_NICE): {e}")
    cmd = tool_command(
        native_tool("llama-speculative-simple"),
        tiny_model_path,
        "a b a b a b",
        "ngram-simple",
        {"size_n": 2, "size_m": 4},
        n_predict=4,
        threads=1,
        n_ctx=256,
    )
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    for _ in range(3):
        with out.open("wb") as o, err.open("wb") as e:
            subprocess.run(cmd, stdout=o, stderr=e, check=True, timeout=120, preexec_fn=_one_cpu_run_to_completion)
        report = parse_report(out.read_bytes(), err.read_text("utf-8", "replace"))
        assert report.n_predict >= 4


@pytest.mark.tools
def test_the_tool_gets_the_prompt_byte_for_byte(tiny_model_path, tiny_model):
    """A backslash-n stays two characters and a trailing newline stays (``-p --no-escape``)."""
    prompt = 'print("a\\nb")\n'
    report = run_tool(
        native_tool("llama-speculative-simple"),
        tiny_model_path,
        prompt,
        "ngram-simple",
        {"size_n": 2, "size_m": 4},
        n_predict=4,
        threads=1,
        n_ctx=256,
    )
    ids = tiny_model.tokenize(prompt)
    assert report.output.startswith(b"\n\n" + b"".join(tiny_model.piece_bytes(t) for t in ids))
