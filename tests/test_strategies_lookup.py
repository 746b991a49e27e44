"""Hand-worked drafts of the two look-up strategies: ``prompt-lookup`` and ``ngram-simple``.

Each expected draft is worked out by hand from the rules in the module docstrings; the convention is that
``history[-1]`` is the newest committed token (llama.cpp's ``sampled`` / ``id_last``). The two differ in
which earlier occurrence they copy from: prompt lookup the *earliest*, ngram-simple the *most recent*.
No model is needed.
"""

from __future__ import annotations

import numpy as np
import pytest

from specviz.errors import KnobError
from specviz.strategies import check_knob_rules, strategy_class
from specviz.strategies.history import find_ngram

Lookup = strategy_class("prompt-lookup")
Simple = strategy_class("ngram-simple")


def draft(cls, history, n_max=16, **knobs):
    d = cls(**knobs)
    d.begin(history)
    return d.draft(history, n_max)


# ------------------------------------------------------------------------------------------------------
# find_ngram, the search both use
# ------------------------------------------------------------------------------------------------------


def test_find_ngram_edge_cases_and_return_value():
    arr = np.array([5, 7, 5, 7, 9, 5, 7], dtype=np.int32)
    pat = np.array([5, 7], dtype=np.int32)
    assert find_ngram(arr, pat, 7, last=False) == 0  # occurrences start at 0, 2 and 5
    assert find_ngram(arr, pat, 7, last=True) == 5
    assert find_ngram(arr, pat, 5, last=True) == 2  # only starts before `end` count
    assert find_ngram(arr, pat, 1, last=True) == 0
    assert find_ngram(arr, pat, 0, last=False) == -1  # no start allowed
    assert find_ngram(arr, np.array([7, 5, 9]), 7, last=False) == -1  # no occurrence
    assert find_ngram(arr, np.array([], dtype=np.int32), 7, last=False) == -1  # an empty pattern
    # an occurrence must fit in the array, whatever `end` says: the trailing 1 has no 2 after it
    assert find_ngram(np.array([1, 2, 3, 1]), np.array([1, 2]), 10, last=True) == 0
    assert find_ngram(np.array([1]), np.array([1, 2]), 5, last=False) == -1  # longer than the array


# ------------------------------------------------------------------------------------------------------
# prompt-lookup
# ------------------------------------------------------------------------------------------------------


def test_lookup_copies_after_the_earliest_occurrence():
    # trailing bigram [1,2] occurs at 1 and at 5 (and at 9, where it is the trailing one itself)
    h = [9, 1, 2, 5, 6, 1, 2, 7, 8, 1, 2]
    assert draft(Lookup, h, 3, max_ngram=2).tokens == [5, 6, 1]  # the most recent would give [7, 8, 1]
    assert draft(Lookup, h, 16, max_ngram=2).tokens == [5, 6, 1, 2, 7, 8, 1, 2]  # up to the end


def test_lookup_tries_sizes_from_max_ngram_down_to_min_ngram():
    h = [3, 7, 7, 1, 2, 3, 8, 8, 1, 2, 3]
    assert draft(Lookup, h, 3, max_ngram=3).tokens == [8, 8, 1]  # [1,2,3] at 3
    assert draft(Lookup, h, 3, max_ngram=2).tokens == [8, 8, 1]  # [2,3] at 4
    assert draft(Lookup, h, 3, max_ngram=1).tokens == [7, 7, 1]  # [3] first at 0
    # the longest size that matches wins, although the unigram [3] occurs earlier
    assert draft(Lookup, h, 3, max_ngram=3, min_ngram=1).tokens == [8, 8, 1]
    assert draft(Lookup, h, 3, max_ngram=3, min_ngram=3).tokens == [8, 8, 1]


def test_lookup_min_ngram_refuses_shorter_matches():
    h = [4, 1, 9, 9, 5, 1]  # only the unigram [1] recurs
    assert draft(Lookup, h, 2, max_ngram=3, min_ngram=1).tokens == [9, 9]
    got = draft(Lookup, h, 2, max_ngram=3, min_ngram=2)
    assert got.tokens == [] and got.reason == "no-match"


def test_lookup_min_ngram_may_equal_max_ngram_but_not_exceed_it():
    check_knob_rules(Lookup, {"min_ngram": 2, "max_ngram": 2})
    with pytest.raises(KnobError) as e:
        check_knob_rules(Lookup, {"min_ngram": 3, "max_ngram": 2})
    assert e.value.knob == "min_ngram"  # the CLI and the inspector point at this knob


def test_lookup_sizes_start_below_the_history_length():
    # max_ngram 5 on 3 tokens: sizes 2 then 1 (an n-gram needs an earlier start than the trailing one)
    assert draft(Lookup, [1, 2, 1], max_ngram=5).tokens == [2, 1]
    # size 2 (L - 1) is tried first: [5,5] at 0 leaves one token to copy (the unigram would copy two)
    assert draft(Lookup, [5, 5, 5], max_ngram=3).tokens == [5]
    assert draft(Lookup, [1, 2], max_ngram=5).reason == "no-match"  # [2] never occurred before
    assert draft(Lookup, [7], max_ngram=3).reason == "no-match"  # nothing to look up in


def test_lookup_copy_stops_at_the_end_of_the_history_and_may_overlap_it():
    assert draft(Lookup, [5, 1, 2, 3, 1, 2], 10, max_ngram=2).tokens == [3, 1, 2]
    # an occurrence overlapping the trailing n-gram: [1,1] at 0, the copy runs into the trailing tokens
    assert draft(Lookup, [1, 1, 1, 1], 10, max_ngram=2).tokens == [1, 1]


def test_lookup_n_max_caps_the_copy():
    h = [9, 1, 2, 5, 6, 7, 8, 1, 2]
    assert draft(Lookup, h, 2, max_ngram=2).tokens == [5, 6]
    assert draft(Lookup, h, 0, max_ngram=2).reason == "limit"


# ------------------------------------------------------------------------------------------------------
# ngram-simple
# ------------------------------------------------------------------------------------------------------


def test_simple_copies_after_the_most_recent_occurrence():
    h = [9, 1, 2, 5, 6, 7, 1, 2, 8, 8, 8, 4, 4, 1, 2]  # [1,2] at 1 and at 6 (and trailing at 13)
    assert draft(Simple, h, size_n=2, size_m=3).tokens == [8, 8, 8]  # the earliest would give [5, 6, 7]


def test_simple_ignores_an_occurrence_at_position_0():
    # upstream uses position 0 to mean "no match"
    got = draft(Simple, [1, 2, 5, 6, 7, 8, 9, 1, 2], size_n=2, size_m=3)
    assert got.tokens == [] and got.reason == "no-match"


def test_simple_needs_more_than_size_n_plus_size_m_plus_one_tokens_before_the_newest():
    got = draft(Simple, [1, 2, 3, 4, 5, 1, 2], size_n=2, size_m=3)  # 6 tokens before the newest
    assert got.tokens == [] and got.reason == "short-history"
    assert draft(Simple, [0, 1, 2, 3, 4, 5, 1, 2], size_n=2, size_m=3).tokens == [3, 4, 5]  # 7


@pytest.mark.parametrize(
    "history,expected",
    [
        # the tokens after the match, up to the newest one excluded, are the most a draft can copy
        ([9, 3, 3, 7, 7, 7, 5, 5, 5, 1, 2, 1, 2], []),  # 1 token after the most recent match: < size_n, none
        ([9, 3, 3, 7, 7, 7, 5, 5, 5, 1, 2, 8, 1, 2], [8, 1]),  # 2 = size_n: drafted
        ([9, 3, 3, 7, 7, 7, 5, 5, 1, 2, 8, 6, 1, 2], [8, 6, 1]),  # 3, between size_n and size_m: all 3
        ([9, 1, 2, 8, 6, 4, 4, 4, 0, 0, 0, 0, 1, 2], [8, 6, 4, 4, 4]),  # more than size_m: size_m of them
    ],
)
def test_simple_copy_condition(history, expected):
    """copy = min(size_m, tokens between the match and the newest one); no draft when copy < size_n."""
    got = draft(Simple, history, size_n=2, size_m=5)
    assert got.tokens == expected
    assert got.reason == (None if expected else "no-match")


def test_simple_most_recent_match_too_close_to_the_end_gives_no_draft():
    h = [9, 1, 2, 7, 7, 7, 5, 5, 5, 1, 2, 1, 2]  # [1,2] at 1 (room for 5) and at 9 (room for 1)
    got = draft(Simple, h, size_n=2, size_m=5)
    assert got.tokens == [] and got.reason == "no-match"


def test_simple_check_rate():
    h = [0, 1, 2, 3, 4, 5, 6, 7, 1, 2]  # cur_len 9
    d = Simple(size_n=2, size_m=3, check_rate=3)
    d.begin(h)
    assert d.draft(h, 16).tokens == [3, 4, 5]  # searched at cur_len 9
    assert d.draft(h + [3], 16).reason == "check-rate"  # 10
    assert d.draft(h + [3, 4], 16).reason == "check-rate"  # 11
    assert d.draft(h + [3, 4, 5], 16).tokens == [6, 7, 1]  # 12: searched again, [4,5] at 4
    d1 = Simple(size_n=2, size_m=3, check_rate=1)
    d1.begin(h)
    d1.draft(h, 16)
    assert d1.draft(h + [3], 16).reason != "check-rate"  # with 1 every call searches


def test_simple_first_search_waits_for_check_rate_tokens_and_a_repeated_call_searches_again():
    h = [0, 1, 2, 3, 4, 5, 6, 7, 1, 2]  # cur_len 9
    for begun in (True, False):  # begin() is optional for a fresh drafter
        d = Simple(size_n=2, size_m=3, check_rate=10)
        if begun:
            d.begin(h[:1])
        assert d.draft(h, 16).reason == "check-rate"  # cur_len 9: fewer than check_rate tokens yet
        assert d.draft(h + [3], 16).tokens == [4, 5, 6]  # cur_len 10: the first search, [2,3] at 2
        assert d.draft(h + [3], 16).tokens == [4, 5, 6]  # the same history again: searched again


def test_simple_n_max_caps_the_copy():
    h = [9, 1, 2, 8, 6, 4, 4, 4, 0, 0, 0, 0, 1, 2]
    assert draft(Simple, h, 2, size_n=2, size_m=5).tokens == [8, 6]


def test_simple_key_size():
    h = [5, 7, 1, 6, 6, 6, 8, 1, 2, 3, 4, 9, 9, 7, 1]
    assert draft(Simple, h, size_n=1, size_m=3).tokens == [2, 3, 4]  # [1] most recently at 7
    assert draft(Simple, h, size_n=2, size_m=3).tokens == [6, 6, 6]  # [7,1] only at 1
