"""specviz.analysis.compare: lanes aligned by position, the first divergence, the figures and the words."""

from __future__ import annotations

import json

from specviz import Session
from specviz.analysis.compare import Lane, compare

PROMPT = "the cat of the dog and the a the cat of the"


def test_two_settings_on_one_prompt(tiny_session):
    c = compare(
        {"strategy": "none"},
        {"strategy": "prompt-lookup", "draft_max": 8},
        prompt=PROMPT,
        max_tokens=50,
        session=tiny_session,
        labels=("plain", "lookup"),
    )
    assert c.a.tokens == c.b.tokens and len(c.a.tokens) == 50  # greedy: the same text
    assert c.first_divergence is None and c.common_prefix == 50
    words = c.words()
    assert words[0] == "lookup differs from plain in strategy none → prompt-lookup."
    assert "Both generate the same 50 tokens." in words
    assert any(w.startswith("lookup accepts ") for w in words)
    assert any(
        w.startswith(f"lookup took {c.b.telemetry['rounds']} rounds for 50 tokens, plain 50 for 50") for w in words
    )
    assert set(c.a.kinds) == {"plain"} and "accepted" in c.b.kinds
    json.dumps(c.to_dict())


def test_the_first_divergence_of_two_sampled_runs(tiny_model):
    s1 = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s2 = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        s1.start(PROMPT, 40, "prompt-lookup", temperature=1.0, seed=1)
        s2.start(PROMPT, 40, "prompt-lookup", temperature=1.0, seed=2)
        s1.run()
        s2.run()
        c = compare(s1, s2)
        d = next(i for i, (x, y) in enumerate(zip(s1.tokens, s2.tokens)) if x != y)
        assert c.first_divergence == d and c.common_prefix == d
        assert f"The texts part at generated token {d}, after {d} identical tokens" in c.text()
    finally:
        s1.close()
        s2.close()


def test_a_fork_lines_up_with_its_original(tiny_session):
    s = tiny_session
    s.start(PROMPT, 40, "prompt-lookup", draft_max=8)
    s.run(5)
    f = s.fork()
    try:
        f.configure("ngram-cache")
        f.run()
        s.run()
        c = compare(s, f, labels=("original", "branch"))
        assert c.a.tokens == c.b.tokens and c.a.rounds[:5] == c.b.rounds[:5]
        assert c.b.strategy == "ngram-cache"
        # a rewind folds into the lane: the dropped rounds are gone, the kept tokens stay
        s.rewind(position=len(s.prompt_tokens) + 3)
        lane = Lane.from_events(s.events, "x")
        assert lane.tokens == s.tokens and len(lane.tokens) == 3
    finally:
        f.close()
