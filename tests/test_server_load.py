"""The bounded load generator (specviz.analysis.server_load): what it refuses before sending, and a failed
request failing the load after every request has returned. Its use against a real llama-server with parallel
slots is in ``test_batch_server_differential.py``."""

from __future__ import annotations

import pytest

from specviz.analysis.llama_server import Completion, free_port
from specviz.analysis.server_load import MAX_CONCURRENT, LoadResult, complete_concurrently, run_load
from specviz.errors import LlamaServerError


def test_nothing_too_much_or_mismatched_budgets_are_refused_before_anything_is_sent():
    url = "http://127.0.0.1:9"  # never reached: each refusal comes first
    with pytest.raises(LlamaServerError, match="no prompts"):
        run_load(url, [], 8)
    with pytest.raises(LlamaServerError, match="more than"):
        run_load(url, ["a"] * (MAX_CONCURRENT + 1), 8)
    with pytest.raises(LlamaServerError, match="2 budgets for 3 prompts"):
        complete_concurrently(url, ["a", "b", "c"], [8, 8])


def test_requests_that_cannot_reach_a_server_fail_the_load_naming_each():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(LlamaServerError, match="2 of 2 concurrent requests failed") as got:
        run_load(url, ["a", [1, 2, 3]], 4, timeout=5)
    assert "request 0" in str(got.value) and "request 1" in str(got.value)


def test_a_load_result_sums_its_requests():
    def answer(n: int, drafted: int, accepted: int) -> Completion:
        timings = {"predicted_n": n, "draft_n": drafted, "draft_n_accepted": accepted}
        return Completion("", list(range(n)), timings, "limit")

    r = LoadResult([answer(10, 6, 4), answer(30, 0, 0)], 2.0, [1.5, 2.0])
    assert (r.tokens_predicted, r.total_tokens_per_second, r.draft_n, r.draft_n_accepted) == (40, 20.0, 6, 4)
    assert LoadResult([], 0.0, []).total_tokens_per_second == 0.0
