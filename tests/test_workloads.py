"""The benchmark's prompt suites and the copied-fraction measure that tells quoting from restating."""

from __future__ import annotations

import pytest

from specviz.analysis.workloads import VARIED_PROMPTS, WORKLOADS, copied_fraction, workload_kinds


def test_kinds_and_suites():
    assert workload_kinds() == ["code-rewrite", "quote", "summarise", "free"]
    assert all(len(prompts) >= 4 for prompts in WORKLOADS.values())
    for prompts in WORKLOADS.values():  # no prompt twice within a kind
        assert len(set(prompts)) == len(prompts)
    assert len(VARIED_PROMPTS) >= 10 and len(set(VARIED_PROMPTS)) == len(VARIED_PROMPTS)


def test_copied_fraction_counts_tokens_inside_long_enough_copied_runs():
    prompt = list(range(100, 120))
    assert copied_fraction(prompt, prompt[3:13], span=8) == 1.0
    # a 4-token copy is too short for span 8; the 9-token copy after it counts in full
    out = prompt[0:4] + [1, 2] + prompt[10:19]
    assert copied_fraction(prompt, out, span=8) == pytest.approx(9 / 15)
    assert copied_fraction(prompt, out, span=4) == pytest.approx(13 / 15)
    # copied runs that overlap are counted once
    assert copied_fraction(prompt, prompt[0:10] + prompt[0:10], span=8) == 1.0
    assert copied_fraction(prompt, [1, 2, 3], span=1) == 0.0
    assert copied_fraction(prompt, [], span=8) == 0.0
    assert copied_fraction([], prompt, span=8) == 0.0


def test_copied_fraction_refuses_a_span_below_one():
    with pytest.raises(ValueError, match="span must be at least 1, got 0"):
        copied_fraction([1, 2], [1, 2], span=0)
