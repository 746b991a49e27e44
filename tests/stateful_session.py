"""A stateful property test of Session, run as a script in its own process by ``test_stateful.py``.

Hypothesis drives random sequences of start, step, run, configure (valid and invalid values, every
strategy, draft models of the same and of another vocabulary, missing files, non-GGUF files), cancel,
snapshot and restore (including a snapshot of another model and a corrupted one) on tiny real GGUF
models, and rewind (to a round, to a position, out of range) and fork. After every call:

* a refused call raised a typed :class:`~specviz.errors.SpecvizError` and changed nothing observable
  (history, strategy, knobs, the pending change, the finish reason, the round counter, the events, the
  cache length);
* the target's cache holds exactly the committed tokens (and a draft model's cache too);
* greedy output is a prefix of plain greedy output for the prompt (knob and strategy changes between
  rounds, snapshots and restores, rewinds and forks, stop strings included);
* a rewind leaves a prefix of the history it cut, and a fork's rounds leave the original untouched.

A segmentation fault or an abort kills this process; the test runner outside sees the exit status.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from specviz import Session, strategy_names, strategy_schema
from specviz.backends.llama import LlamaContext, LlamaModel
from specviz.errors import SpecvizError
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama

TMP = Path(tempfile.mkdtemp(prefix="specviz-stateful-"))
TARGET = write_tiny_llama(TMP / "target.gguf", seed=1, block_scale=0.1)
SAME_VOCAB_DRAFT = write_tiny_llama(TMP / "draft.gguf", n_layer=1, layers_from=tiny_weights(seed=1, block_scale=0.1))
OTHER_MODEL = write_tiny_llama(TMP / "other.gguf", seed=3, block_scale=0.1)  # same vocabulary, other weights
OTHER_VOCAB = write_tiny_llama(TMP / "other_vocab.gguf", seed=5, vocab_size=300)
JUNK = TMP / "junk.gguf"
JUNK.write_bytes(b"GGUF" + os.urandom(200))
TEXT = TMP / "notes.txt"
TEXT.write_text("not a model\n")
MISSING = TMP / "missing.gguf"
DRAFT_PATHS = [SAME_VOCAB_DRAFT, OTHER_VOCAB, JUNK, TEXT, MISSING]

PROMPTS = ["the a of the a of the cat", "def f(x): return x + x + x", "1 2 3 1 2 3 1 2", "a"]
CTX = dict(n_ctx=256, n_batch=32, n_ubatch=32, n_threads=1)

MODEL = LlamaModel(TARGET)
_PLAIN: dict[tuple[int, ...], list[int]] = {}


def plain_greedy(prompt_ids: list[int], n: int) -> list[int]:
    """Plain greedy tokens after ``prompt_ids``: one token per decode, numpy argmax, NaN as -inf."""
    key = tuple(prompt_ids)
    have = _PLAIN.get(key, [])
    if len(have) >= n:
        return have[:n]
    ctx = LlamaContext(MODEL, **CTX)
    ctx.eval_prompt(prompt_ids[:-1], 0)
    ctx.eval(prompt_ids[-1:], len(prompt_ids) - 1, rows="all")
    row, pos, out = ctx.row(0), len(prompt_ids), []
    while len(out) < n and pos < CTX["n_ctx"]:
        t = int(np.argmax(np.where(np.isnan(row), -np.inf, row)))
        out.append(t)
        if MODEL.is_eog(t):
            break
        ctx.eval([t], pos, rows="all")
        row, pos = ctx.row(0), pos + 1
    ctx.close()
    _PLAIN[key] = out
    return out


def knob_values(strategy: str) -> st.SearchStrategy[dict]:
    """Knob settings for ``strategy``: mostly valid, sometimes out of range or of the wrong type."""
    pieces = {}
    for k in strategy_schema(strategy).knobs:
        if k.name == "draft_model":
            good = st.sampled_from([str(p) for p in DRAFT_PATHS])
        elif k.type is bool:
            good = st.booleans()
        elif k.choices:
            good = st.sampled_from(k.choices)
        elif k.type is int:
            hi = min(int(k.hi if k.hi is not None else 64), 64 if k.name != "pool_size" else 4096)
            good = st.integers(int(k.lo or 0), max(int(k.lo or 0), hi))
        else:
            good = st.floats(k.lo or 0.0, k.hi or 1.0)
        bad = st.sampled_from([-5, "lots", None, 10**9, 2.5, [1]])
        pieces[k.name] = st.one_of(good, good, good, bad)
    return st.fixed_dictionaries({}, optional=pieces)


class SessionMachine(RuleBasedStateMachine):
    """Random use of one Session (and of sessions restored from its snapshots)."""

    def __init__(self) -> None:
        super().__init__()
        self.s = Session(MODEL, **CTX)
        self.snapshots: list[bytes] = []
        self.other_snapshot: bytes | None = None

    def teardown(self) -> None:
        self.s.close()

    # -- helpers -------------------------------------------------------------------------------
    def observable(self) -> tuple:
        s = self.s
        return (
            list(s.history),
            s.strategy,
            dict(s.knobs),
            s.generation.pending,
            s.finished,
            s.round_index,
            len(s.events),
            s.kv_length if s.started else None,
            s.drafter,
        )

    def attempt(self, call, *args, **kwargs):
        """Run ``call``; a refusal must be typed and change nothing. Returns (ok, result)."""
        before = self.observable()
        try:
            return True, call(*args, **kwargs)
        except SpecvizError:
            assert self.observable() == before, f"a refused {call.__name__} changed the session"
            return False, None

    # -- rules ---------------------------------------------------------------------------------
    @initialize(prompt=st.sampled_from(PROMPTS))
    def begin(self, prompt):
        self.s.start(prompt, 24, "prompt-lookup")

    @rule(
        data=st.data(),
        prompt=st.sampled_from(PROMPTS),
        strategy=st.sampled_from(strategy_names() + ["bogus"]),
        max_tokens=st.sampled_from([1, 5, 24, 60, 0, -3, "x"]),
        temperature=st.sampled_from([0.0, 0.0, 0.0, 0.7]),
        stop=st.sampled_from([None, None, ["e"], ["\x00", "th"], [""], "a"]),
    )
    def start(self, data, prompt, strategy, max_tokens, temperature, stop):
        knobs = data.draw(knob_values(strategy)) if strategy in strategy_names() else {}
        self.attempt(self.s.start, prompt, max_tokens, strategy, temperature=temperature, seed=3, stop=stop, **knobs)

    @rule()
    def step(self):
        self.attempt(self.s.step)

    @rule(n=st.integers(1, 6))
    def run(self, n):
        self.attempt(self.s.run, n)

    @rule(data=st.data(), strategy=st.sampled_from(strategy_names() + [None, "bogus"]))
    def configure(self, data, strategy):
        name = strategy or self.s.strategy
        knobs = data.draw(knob_values(name)) if name in strategy_names() else {}
        self.attempt(self.s.configure, strategy, **knobs)

    @rule(path=st.sampled_from(DRAFT_PATHS))
    def configure_draft_model(self, path):
        self.attempt(self.s.configure, "draft", draft_model=str(path), draft_p_min=0.0)

    @rule()
    def cancel(self):
        self.s.cancel()

    @rule()
    def snapshot(self):
        ok, blob = self.attempt(self.s.snapshot)
        if ok:
            self.snapshots.append(blob)

    @precondition(lambda self: self.snapshots)
    @rule(data=st.data())
    def restore_into(self, data):
        self.attempt(self.s.restore_into, data.draw(st.sampled_from(self.snapshots)))

    @precondition(lambda self: self.snapshots)
    @rule(data=st.data(), where=st.sampled_from(["start", "middle", "end", "truncate"]))
    def restore_corrupted(self, data, where):
        blob = bytearray(data.draw(st.sampled_from(self.snapshots)))
        if where == "truncate":
            blob = blob[: len(blob) // 2]
        else:
            i = {"start": 3, "middle": len(blob) // 2, "end": len(blob) - 5}[where]
            blob[i] ^= 0xFF
        ok, _ = self.attempt(self.s.restore_into, bytes(blob))
        assert not ok, "a corrupted snapshot was accepted"

    @rule()
    def restore_snapshot_of_another_model(self):
        if self.other_snapshot is None:
            other = Session(OTHER_MODEL, **CTX)
            other.start("the a of", 8, "none")
            other.run(2)
            self.other_snapshot = other.snapshot()
            other.close()
        ok, _ = self.attempt(self.s.restore_into, self.other_snapshot)
        assert not ok, "a snapshot of another model was accepted"

    @precondition(lambda self: self.snapshots)
    @rule(data=st.data(), rounds=st.integers(0, 4))
    def restore_as_new_session(self, data, rounds):
        blob = data.draw(st.sampled_from(self.snapshots))
        s2 = Session.restore(blob, model=MODEL)
        try:
            if s2.finished is None:
                s2.run(rounds)
            check_session(s2)
        finally:
            s2.close()

    @rule(data=st.data(), how=st.sampled_from(["round", "round", "position", "out-of-range"]))
    def rewind(self, data, how):
        s = self.s
        history = list(s.history)
        if how == "round":
            ok, ev = self.attempt(s.rewind, data.draw(st.integers(0, max(s.round_index, 0))))
        elif how == "position":
            lo = s.generation.checkpoints[0].n_history if s.generation.checkpoints else 1
            ok, ev = self.attempt(s.rewind, position=data.draw(st.integers(lo, max(len(history), lo))))
        else:
            bad = data.draw(
                st.sampled_from(
                    [
                        {"round": -1},
                        {"round": s.round_index + 1},
                        {"position": 0},
                        {"position": len(history) + 1},
                        {"round": "2"},
                    ]
                )
            )
            ok, ev = self.attempt(s.rewind, **bad)
            assert not ok, f"an out-of-range rewind {bad} was accepted"
        if ok:
            assert s.history == history[: len(s.history)] and ev.position == len(s.history)
            assert s.events[-1] is ev

    @rule(rounds=st.integers(0, 4), strategy=st.sampled_from(["prompt-lookup", "ngram-cache", None]))
    def fork(self, rounds, strategy):
        before = self.observable()
        ok, f = self.attempt(self.s.fork)
        if not ok:
            return
        try:
            if strategy is not None:
                f.configure(strategy)
            if f.finished is None:
                f.run(rounds)
            check_session(f)
        finally:
            f.close()
        assert self.observable() == before, "running a fork changed the original session"
        check_session(self.s)

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def consistent(self):
        check_session(self.s)


def check_session(s: Session) -> None:
    if not s.started:
        return
    assert s.kv_length == s.committed, f"cache holds {s.kv_length}, committed {s.committed}"
    if s.drafter is not None and s.drafter.has_context:
        assert s.drafter.kv_length() == s.committed, "the draft model's cache is out of step"
    if s.generation.sampling.greedy:
        ref = plain_greedy(s.prompt_tokens, len(s.tokens))
        assert s.tokens == ref, f"greedy output differs from plain greedy at {s.tokens} vs {ref}"


def main() -> int:
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    run_state_machine_as_test(
        SessionMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            derandomize=not os.environ.get("SPECVIZ_STATEFUL_RANDOM"),
            suppress_health_check=list(HealthCheck),
        ),
    )
    print(f"stateful session test: {examples} sequences of up to {steps} calls passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
