"""Unit tests of llama.cpp's draftless strategies: ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache.

Expected drafts are worked out by hand from upstream's semantics (see each module's docstring); the
convention is that ``history[-1]`` is the newest committed token (upstream's ``sampled``). No model is
needed.
"""

from __future__ import annotations

import json
from copy import deepcopy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specviz.errors import KnobError, SnapshotError
from specviz.strategies import check_knob_rules, context_hooks, strategy_class, strategy_names, strategy_schema
from specviz.strategies.knobs import ngram_size_knobs

MapK = strategy_class("ngram-map-k")
MapK4V = strategy_class("ngram-map-k4v")
Mod = strategy_class("ngram-mod")
Cache = strategy_class("ngram-cache")

F = 6364136223846793005  # upstream's LCG multiplier


def fresh(cls, history, **knobs):
    d = cls(**knobs)
    d.begin(history)
    return d


# ------------------------------------------------------------------------------------------------
# registry and knobs
# ------------------------------------------------------------------------------------------------

# (strategy, knob, default, lo, hi) — the documented schema, written out independently of the code
KNOB_TABLE = [
    ("ngram-map-k", "size_n", 12, 1, 1024),
    ("ngram-map-k", "size_m", 48, 1, 1024),
    ("ngram-map-k", "min_hits", 1, 1, 1024),
    ("ngram-map-k", "check_rate", 1, 1, 1024),
    ("ngram-map-k", "tree_width", 1, 1, 16),
    ("ngram-map-k4v", "size_n", 12, 1, 1024),
    ("ngram-map-k4v", "size_m", 48, 1, 1024),
    ("ngram-map-k4v", "min_hits", 1, 1, 1024),
    ("ngram-map-k4v", "check_rate", 1, 1, 1024),
    ("ngram-map-k4v", "tree_width", 1, 1, 16),
    ("ngram-mod", "n_match", 24, 1, 1024),
    ("ngram-mod", "n_min", 48, 1, 1024),
    ("ngram-mod", "n_max", 64, 1, 1024),
    ("ngram-mod", "pool_size", 4 * 1024 * 1024, 1024, 64 * 1024 * 1024),
    ("ngram-mod", "low_accept_ratio", 0.25, 0.0, 1.0),
    ("ngram-mod", "low_accept_streak", 5, 1, 1024),
    ("ngram-cache", "n_draft", 8, 1, 1024),
    ("ngram-cache", "tree_width", 1, 1, 16),
]


def test_strategies_are_registered():
    for name in ("ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"):
        assert name in strategy_names()
        assert strategy_class(name).name == name


def test_schema_lists_exactly_the_documented_knobs_and_the_shared_ones():
    for name in ("ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"):
        own = [k for (s, k, *_rest) in KNOB_TABLE if s == name]
        assert strategy_schema(name).names() == ["draft_max", "draft_min", "draft_policy", "align", "verify_tile"] + own


@pytest.mark.parametrize("name,knob,default,lo,hi", KNOB_TABLE)
def test_knob_default_and_bounds(name, knob, default, lo, hi):
    schema = strategy_schema(name)
    assert schema.defaults()[knob] == default
    assert schema.validate({knob: lo})[knob] == lo
    assert schema.validate({knob: hi})[knob] == hi
    step = 1 if isinstance(default, int) else 0.01
    with pytest.raises(KnobError) as below:
        schema.validate({knob: lo - step})
    assert below.value.knob == knob
    with pytest.raises(KnobError) as above:
        schema.validate({knob: hi + step})
    assert above.value.knob == knob


def test_ngram_size_knobs_are_the_documented_schema():
    # called directly: the strategy classes build their knobs at import time
    def table(knobs):
        return [(k.name, k.type, k.default, k.lo, k.hi, k.choices, k.aliases) for k in knobs]

    assert table(ngram_size_knobs("ngram-simple", min_hits=False)) == [
        ("size_n", int, 12, 1, 1024, (), ("--spec-ngram-simple-size-n",)),
        ("size_m", int, 48, 1, 1024, (), ("--spec-ngram-simple-size-m",)),
        ("check_rate", int, 1, 1, 1024, (), ()),
    ]
    assert table(ngram_size_knobs("ngram-map-k4v", min_hits=True)) == [
        ("size_n", int, 12, 1, 1024, (), ("--spec-ngram-map-k4v-size-n",)),
        ("size_m", int, 48, 1, 1024, (), ("--spec-ngram-map-k4v-size-m",)),
        ("min_hits", int, 1, 1, 1024, (), ("--spec-ngram-map-k4v-min-hits",)),
        ("check_rate", int, 1, 1, 1024, (), ()),
    ]
    assert all(isinstance(k.help, str) and k.help.strip() for k in ngram_size_knobs("ngram-map-k", min_hits=True))


@pytest.mark.parametrize("name", ["ngram-map-k", "ngram-map-k4v", "ngram-mod"])
def test_int_knobs_refuse_fractions(name):
    knob = "size_n" if name.startswith("ngram-map") else "n_match"
    with pytest.raises(KnobError):
        strategy_schema(name).validate({knob: 2.5})


def test_cli_spellings_follow_llama_cpp():
    def aliases(name, knob):
        return next(k for k in strategy_class(name).knobs if k.name == knob).aliases

    # llama.cpp (the version llama-cpp-python 0.3.36 vendors) spells these per type
    for name in ("ngram-simple", "ngram-map-k", "ngram-map-k4v"):
        assert f"--spec-{name}-size-n" in aliases(name, "size_n")
        assert f"--spec-{name}-size-m" in aliases(name, "size_m")
    for name in ("ngram-map-k", "ngram-map-k4v"):
        assert f"--spec-{name}-min-hits" in aliases(name, "min_hits")
    assert "--spec-ngram-mod-n-match" in aliases("ngram-mod", "n_match")
    assert "--spec-ngram-mod-n-min" in aliases("ngram-mod", "n_min")
    assert "--spec-ngram-mod-n-max" in aliases("ngram-mod", "n_max")


def test_ngram_mod_refuses_n_min_above_n_max():
    cfg = strategy_schema("ngram-mod").validate({"n_min": 10, "n_max": 9})
    with pytest.raises(KnobError) as e:
        check_knob_rules(Mod, cfg)
    assert e.value.knob == "n_min"
    check_knob_rules(Mod, strategy_schema("ngram-mod").validate({"n_min": 9, "n_max": 9}))  # equal is fine


# ------------------------------------------------------------------------------------------------
# ngram-map-k
# ------------------------------------------------------------------------------------------------


def test_map_k_drafts_after_the_most_recent_usable_occurrence():
    # key [1,2] occurs at 1, 6 and (as the trailing key) 12; usable starts are 1..cur_len-n-m-1 = 7
    h = [7, 1, 2, 3, 4, 5, 1, 2, 6, 6, 6, 0, 1, 2]
    d = fresh(MapK, h, size_n=2, size_m=3)
    got = d.draft(h, 16)
    assert got.tokens == [6, 6, 6]
    assert got.reason is None


def test_map_k_caps_by_n_max_without_a_reason():
    h = [7, 1, 2, 3, 4, 5, 1, 2, 6, 6, 6, 0, 1, 2]
    got = fresh(MapK, h, size_n=2, size_m=3).draft(h, 2)
    assert got.tokens == [6, 6]


def test_map_k_history_length_and_match_position_limits():
    # 2n+m = 7 tokens of history before the newest one are needed
    h = [7, 1, 2, 3, 4, 1, 2]
    assert fresh(MapK, h, size_n=2, size_m=3).draft(h, 16).reason == "short-history"
    h = [7, 1, 2, 3, 4, 5, 1, 2]
    assert fresh(MapK, h, size_n=2, size_m=3).draft(h, 16).tokens == [3, 4, 5]
    # an occurrence whose m-gram would reach the newest tokens is not used
    h = [7, 7, 7, 7, 1, 2, 3, 4, 1, 2]
    assert fresh(MapK, h, size_n=2, size_m=3).draft(h, 16).reason == "no-match"
    # an occurrence at index 0 is not used (upstream treats position 0 as "no match")
    h = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert fresh(MapK, h, size_n=2, size_m=3).draft(h, 16).reason == "no-match"


def test_map_k_accepted_count_caps_the_next_draft_for_that_key():
    h1 = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    d = fresh(MapK, h1, size_n=2, size_m=3)
    assert d.draft(h1, 16).tokens == [3, 4, 5]
    h1b = h1 + [3, 0]  # one draft token accepted, then the target's own token 0
    d.accept(1, h1b)
    h2 = h1b + [1, 2]
    got = d.draft(h2, 16)
    assert got.tokens == [3]
    assert got.reason == "accept-cap"
    d.accept(0, h2 + [0])
    h3 = h2 + [0, 1, 2]
    got = d.draft(h3, 16)
    assert got.tokens == [] and got.reason == "accept-cap"
    # another key is not affected
    h4 = h3 + [4]
    # key [2,4] never occurred before: no match
    assert d.draft(h4, 16).reason == "no-match"


def test_map_k_check_rate():
    h = [7, 1, 2, 3, 4, 5, 6, 8, 8, 8, 9, 1, 2]
    d = fresh(MapK, h, size_n=2, size_m=3, check_rate=3)
    assert d.draft(h, 16).tokens == [3, 4, 5]  # checked at cur_len 12; positions 1..6 are indexed
    assert d.draft(h + [3], 16).reason == "check-rate"  # 13
    assert d.draft(h + [3, 4], 16).reason == "check-rate"  # 14
    # cur_len 15: key [4,5], indexed at 4 -> the three tokens after it
    assert d.draft(h + [3, 4, 5], 16).tokens == [6, 8, 8]
    # with check_rate 1 every call searches
    d1 = fresh(MapK, h, size_n=2, size_m=3)
    d1.draft(h, 16)
    assert d1.draft(h + [3], 16).reason != "check-rate"


def test_map_k_keeps_drafting_from_the_occurrence_it_first_found():
    # upstream's key index: the first look-up indexes the positions of begin's history (newest first, a
    # slot keeps its first position), so key [1,2] stays at 5 although it occurs again later at 12
    h = [7, 1, 2, 3, 4, 1, 2, 6, 6, 6, 9, 9, 9, 9, 9]
    d = fresh(MapK, h, size_n=2, size_m=3)
    assert d.draft(h, 16).reason == "no-match"  # key [9,9]: its occurrences are too recent
    h2 = h + [8, 1, 2, 0, 0, 0, 0, 0, 1, 2]
    assert d.draft(h2, 16).tokens == [6, 6, 6]  # the most recent occurrence (at 17) is followed by 0s
    # a drafter begun on the longer history searches it afresh and finds the most recent one
    assert fresh(MapK, h2, size_n=2, size_m=3).draft(h2, 16).tokens == [0, 0, 0]


def test_map_k_never_searches_the_end_of_begins_history_again():
    # after the first look-up, the last size_n + size_m + 1 positions of begin's history are neither
    # indexed nor searched (upstream's ranges leave them out): key [4,5] at 4 is not found
    h = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    d = fresh(MapK, h, size_n=2, size_m=3)
    assert d.draft(h, 16).tokens == [3, 4, 5]
    h2 = h + [3, 4, 5]
    assert d.draft(h2, 16).reason == "no-match"
    assert fresh(MapK, h2, size_n=2, size_m=3).draft(h2, 16).tokens == [9, 1, 2]  # a first look-up finds it


def test_map_k_min_hits_counts_look_ups_of_the_key():
    h1 = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    d = fresh(MapK, h1, size_n=2, size_m=3, min_hits=2)
    assert d.draft(h1, 16).reason == "min-hits"
    h2 = h1 + [3, 0, 1, 2]  # same key, looked up a second time
    assert d.draft(h2, 16).tokens == [3, 4, 5]


# ------------------------------------------------------------------------------------------------
# ngram-map-k4v
# ------------------------------------------------------------------------------------------------


def segments(values):
    """[0] + [1,2,a,a] per value + [9,9,1,2]: key [1,2] followed by m-gram [a,a]; trailing key [1,2]."""
    out = [0]
    for a in values:
        out += [1, 2, a, a]
    return out + [9, 9, 1, 2]


def test_k4v_drafts_after_the_occurrence_found_when_one_value_dominates():
    h = segments([3, 3, 3, 5])  # [3,3] three times, [5,5] once: 3 >= 2*1
    got = fresh(MapK4V, h, size_n=2, size_m=2).draft(h, 16)
    # as upstream's code (not its comment): the tokens after the occurrence found, the most recent
    # one here, although the dominant value is [3,3]
    assert got.tokens == [5, 5]
    assert got.reason is None


@pytest.mark.parametrize(
    "values,expected",
    [
        ([3, 5, 3, 5], None),  # 2 vs 2: ambiguous
        ([3, 3, 5], [5, 5]),  # 2 vs 1: 2 >= 2*1, drafts (after the most recent occurrence)
        ([3, 3, 3, 5, 6], None),  # 3 vs 1+1: 3 < 4, ambiguous
        ([3, 3, 3, 3, 5, 6], [6, 6]),  # 4 vs 2: drafts
        ([5], [5, 5]),  # a single value
    ],
)
def test_k4v_dominance_rule(values, expected):
    h = segments(values)
    got = fresh(MapK4V, h, size_n=2, size_m=2).draft(h, 16)
    if expected is None:
        assert got.tokens == [] and got.reason == "ambiguous"
    else:
        assert got.tokens == expected


def test_k4v_tracks_at_most_four_values():
    # four values once each fill the slots; a fifth value, however frequent, is not counted
    h = segments([3, 4, 5, 6] + [7] * 9)
    d = fresh(MapK4V, h, size_n=2, size_m=2)
    got = d.draft(h, 16)
    assert got.reason == "ambiguous"  # 1 vs 3
    (rec,) = d.state()["keys"]
    assert rec["tokens"] == [1, 2]
    # [value_idx, value_num, n_accepted]: values start at 3, 7, 11, 15
    assert rec["values"] == [[3, 1, 2], [7, 1, 2], [11, 1, 2], [15, 1, 2]]


def test_k4v_min_hits_and_counting_restarts_at_the_occurrence_found():
    h1 = segments([3, 3, 3])  # key starts 1, 5, 9; trailing key at 15
    d = fresh(MapK4V, h1, size_n=2, size_m=2, min_hits=2)
    assert d.draft(h1, 16).reason == "min-hits"  # the first look-up indexes positions 1..11: [1,2] -> 9
    h2 = h1 + [3, 3, 9, 9, 1, 2]  # the key at 15 is at the end of begin's history: never searched
    assert d.draft(h2, 16).tokens == [3, 3]
    (rec,) = d.state()["keys"]
    assert rec["key_num"] == 2
    assert rec["values"][0][:2] == [3, 3]  # occurrences 1, 5 and 9
    h3 = h2 + [3, 3, 9, 9, 1, 2]
    d.draft(h3, 16)
    (rec,) = d.state()["keys"]
    assert rec["values"][0][1] == 4  # as upstream: counting restarts at 9, which is counted again


def test_k4v_accepted_count_caps_the_dominant_value():
    h = segments([3, 3, 3])
    d = fresh(MapK4V, h, size_n=2, size_m=2)
    assert d.draft(h, 16).tokens == [3, 3]
    d.accept(1, h + [3, 8])
    h2 = h + [3, 8, 9, 9, 1, 2]
    got = d.draft(h2, 16)
    assert got.tokens == [3] and got.reason == "accept-cap"


# ------------------------------------------------------------------------------------------------
# ngram-mod
# ------------------------------------------------------------------------------------------------


def test_mod_slot_is_upstreams_lcg_hash_modulo_the_pool():
    d = Mod(n_match=3, pool_size=1 << 20)
    a, b, c = 1000, 7, 123456
    h = ((a * F + b) * F + c) % 2**64
    assert d.slot([a, b, c]) == h % (1 << 20)
    # begin adds the n-grams whose next token is in the cache: not the one ending at the pending token 14
    h = fresh(Mod, [10, 11, 12, 13, 14], n_match=3, pool_size=1 << 20)
    assert h.pool[h.slot([10, 11, 12])] == 13
    assert int(np.count_nonzero(h.pool != -1)) == 1


def test_mod_chained_draft():
    h = [10, 11, 12, 13, 14, 15, 16, 20, 10, 11, 12]
    knobs = dict(n_match=3, n_min=1, pool_size=1 << 20)
    got = fresh(Mod, h, n_max=5, **knobs).draft(h, 10)
    assert got.tokens == [13, 14, 15, 16, 20] and got.reason is None
    # the chain follows the pool past the end of the earlier occurrence
    assert fresh(Mod, h, n_max=7, **knobs).draft(h, 10).tokens == [13, 14, 15, 16, 20, 10, 11]
    assert fresh(Mod, h, n_max=7, **knobs).draft(h, 3).tokens == [13, 14, 15]


PROMPT = [1, 2, 3, 4, 5, 6, 7]


def _distinct_slots(d, grams):
    slots = [d.slot(g) for g in grams]
    assert len(set(slots)) == len(slots), "test precondition: no hash collision"


def test_mod_new_ngrams_are_added_in_chunks_and_n_min_drops_short_chains():
    knobs = dict(n_match=3, n_max=5, pool_size=1 << 20)
    h = PROMPT + [8, 1, 2, 3]  # cur_len 10: fewer than 33 new tokens, nothing added since begin
    d = fresh(Mod, PROMPT, n_min=1, **knobs)  # begin adds (1,2,3) (2,3,4) (3,4,5): 7 is pending
    _distinct_slots(d, [(1, 2, 3), (2, 3, 4), (3, 4, 5), (4, 5, 6), (5, 6, 7)])
    got = d.draft(h, 16)
    assert got.tokens == [4, 5, 6] and got.reason == "no-match"  # (4,5,6) -> 7 not added yet
    assert fresh(Mod, PROMPT, n_min=3, **knobs).draft(h, 16).tokens == [4, 5, 6]
    got = fresh(Mod, PROMPT, n_min=4, **knobs).draft(h, 16)
    assert got.tokens == [] and got.reason == "n-min"


def test_mod_chunk_boundary():
    knobs = dict(n_match=3, n_min=1, n_max=5, pool_size=1 << 20)
    # begin(PROMPT) leaves i_last = 3; a draft adds [i_last, cur_len - n) once i_last + 32 < cur_len
    h_short = PROMPT + [8] + list(range(100, 125)) + [1, 2, 3]  # cur_len 35: not yet
    h_long = PROMPT + [8] + list(range(100, 126)) + [1, 2, 3]  # cur_len 36: added
    assert fresh(Mod, PROMPT, **knobs).draft(h_short, 16).tokens == [4, 5, 6]
    assert fresh(Mod, PROMPT, **knobs).draft(h_long, 16).tokens == [4, 5, 6, 7, 8]
    # begin on the whole history adds every n-gram at once (documented difference from a running session)
    assert fresh(Mod, h_short, **knobs).draft(h_short, 16).tokens == [4, 5, 6, 7, 8]


def test_mod_short_history():
    got = fresh(Mod, [1, 2, 3], n_match=3, n_min=1, n_max=4).draft([1, 2, 3], 4)
    assert got.tokens == [] and got.reason == "short-history"


def test_mod_a_full_window_is_enough_history():
    # cur_len 3 = n_match: the window exists (no "short-history"); the pool is still empty
    got = fresh(Mod, [1, 2, 3, 4], n_match=3, n_min=1, n_max=4).draft([1, 2, 3, 4], 4)
    assert got.tokens == [] and got.reason == "n-min"


def test_mod_a_draft_cut_by_the_round_has_no_reason():
    # begin adds (10,11,12) ... (16,20,10): the chain 13 14 15 16 20 10 11 ends at (20,10,11), 7 tokens
    h = [10, 11, 12, 13, 14, 15, 16, 20, 10, 11, 12]
    d = fresh(Mod, h, n_match=3, n_min=1, n_max=10, pool_size=1 << 20)
    got = d.draft(h, 3)
    assert got.tokens == [13, 14, 15] and got.reason is None  # the round's limit, not a short chain
    got = d.draft(h, 16)
    assert got.tokens == [13, 14, 15, 16, 20, 10, 11] and got.reason == "no-match"


def test_mod_one_token_drafts_count_towards_the_low_acceptance_streak():
    h = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    d = fresh(Mod, h, n_match=3, n_min=1, n_max=4, pool_size=1 << 20, low_accept_streak=2)
    for _ in range(2):
        assert d.draft(h, 1).tokens == [4]
        d.accept(0, h)
    assert int(np.count_nonzero(d.pool != -1)) == 0


def _low_rounds(d, h, k):
    for _ in range(k):
        got = d.draft(h, 16)
        assert got.tokens == [4, 5, 6, 7]
        d.accept(0, h)


def test_mod_resets_after_a_streak_of_low_acceptance():
    h = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]  # short history: not refilled after a reset
    knobs = dict(n_match=3, n_min=1, n_max=4, pool_size=1 << 20)
    d = fresh(Mod, h, **knobs)
    _low_rounds(d, h, 4)
    d.draft(h, 16)
    d.accept(1, h)  # 1/4 = 0.25 is not below the threshold: the streak ends
    _low_rounds(d, h, 4)
    assert d.draft(h, 16).tokens == [4, 5, 6, 7]
    d.accept(0, h)  # fifth low round in a row
    assert int(np.count_nonzero(d.pool != -1)) == 0
    got = d.draft(h, 16)
    assert got.tokens == [] and got.reason == "n-min"


def test_mod_streak_knobs():
    h = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    d = fresh(Mod, h, n_match=3, n_min=1, n_max=4, pool_size=1 << 20, low_accept_streak=2, low_accept_ratio=0.5)
    d.draft(h, 16)
    d.accept(1, h)  # 0.25 < 0.5: low
    d.draft(h, 16)
    d.accept(2, h)  # 0.5: not low
    d.draft(h, 16)
    d.accept(1, h)
    assert d.draft(h, 16).tokens == [4, 5, 6, 7]
    d.accept(1, h)  # second low in a row: reset
    assert d.draft(h, 16).tokens == []


def test_mod_pool_is_refilled_from_the_history_after_a_reset():
    h = list(range(40, 80)) + [40, 41, 42]  # cur_len 42 > 32: the next draft re-adds everything
    d = fresh(Mod, h, n_match=3, n_min=1, n_max=4, pool_size=1 << 20, low_accept_streak=1)
    assert d.draft(h, 16).tokens == [43, 44, 45, 46]
    d.accept(0, h)
    assert int(np.count_nonzero(d.pool != -1)) == 0
    assert d.draft(h, 16).tokens == [43, 44, 45, 46]


def test_mod_occupancy_guard_in_begin():
    # begin adds 399 distinct bigrams: they occupy more than a quarter of 1024 slots, and the pool is cleared
    h = list(range(1000, 1400)) + [1000, 1001]
    d = Mod(n_match=2, n_min=1, n_max=4, pool_size=1024)
    starts = range(len(h) - 1 - 2)
    assert len({d.slot(h[i : i + 2]) for i in starts}) > 256  # test precondition
    d.begin(h)
    assert int(np.count_nonzero(d.pool != -1)) == 0
    assert d.draft(h, 16).reason == "n-min"
    # overwriting the same slots again and again occupies no more of them: the guard does not fire
    h = [1, 2] * 600
    assert fresh(Mod, h, n_match=2, n_min=1, n_max=4, pool_size=1024).draft(h, 16).tokens == [1, 2, 1, 2]
    # with a larger pool the guard does not fire either
    h = list(range(1000, 1400)) + [1000, 1001]
    d = fresh(Mod, h, n_match=2, n_min=1, n_max=4, pool_size=8192)
    assert d.draft(h, 16).tokens == [1002, 1003, 1004, 1005]


def test_mod_occupancy_guard_fires_above_a_quarter_of_the_pool_only():
    knobs = dict(n_match=1, n_min=1, n_max=2, pool_size=1024)
    # with n_match 1 a token's slot is the token itself (modulo 1024): begin adds 256 distinct slots,
    # exactly a quarter of the pool, and keeps them
    h = list(range(256)) + [1000, 1001]
    d = fresh(Mod, h, **knobs)
    assert d.slot([255]) == 255  # the premise
    assert int(np.count_nonzero(d.pool != -1)) == 256
    # 257 slots are more than a quarter: cleared, and the pool holds nothing before position 257
    h = list(range(257)) + [1000, 1001]
    d = fresh(Mod, h, **knobs)
    assert int(np.count_nonzero(d.pool != -1)) == 0
    assert (d.state()["lo"], d.state()["i_last"]) == (257, 257)
    # later chunks add only the newer n-grams (41 of them, slots 1000, 1001 and 952..990): token 5's
    # follower stays forgotten
    h2 = h + list(range(3000, 3040)) + [5]
    got = d.draft(h2, 16)
    assert got.tokens == [] and got.reason == "n-min"
    assert (d.state()["lo"], d.state()["i_last"]) == (257, 298)
    # and the state rebuilds exactly that pool
    r = fresh(Mod, h2, **knobs)
    r.load_state(d.state())
    assert np.array_equal(r.pool, d.pool) and int(np.count_nonzero(r.pool != -1)) == 41


def test_mod_memory_is_constant():
    d = Mod(n_match=4, n_min=1, n_max=8, pool_size=1 << 16)
    pool_id = id(d._pool)
    assert d.pool_bytes == (1 << 16) * 4
    rng = np.random.default_rng(0)
    h = rng.integers(0, 50, size=200).tolist()
    d.begin(h)
    size_small = len(json.dumps(d.state()))
    for _ in range(40):
        h += rng.integers(0, 50, size=500).tolist()
        d.draft(h, 8)
        d.accept(0, h)
    assert len(h) > 20000
    assert d.pool_bytes == (1 << 16) * 4 and id(d._pool) == pool_id
    assert d._pool.shape == (1 << 16,)
    # the saved state does not grow with the history either (a few integers)
    assert len(json.dumps(d.state())) <= size_small + 16


# ------------------------------------------------------------------------------------------------
# ngram-cache
# ------------------------------------------------------------------------------------------------


def test_cache_drafts_a_repeating_cycle():
    h = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    got = fresh(Cache, h).draft(h, 16)
    assert got.tokens == [4, 1, 2, 3, 4, 1, 2, 3] and got.reason is None  # n_draft = 8
    assert fresh(Cache, h, n_draft=3).draft(h, 16).tokens == [4, 1, 2]
    assert fresh(Cache, h).draft(h, 2).tokens == [4, 1]


def test_cache_unigram_share_threshold():
    # only the 1-gram (3) has followers: {8: 2, 9: 1}; 200 >= 66*3 passes
    h = [3, 8, 3, 9, 3, 8, 5, 3]
    assert fresh(Cache, h, n_draft=1).draft(h, 16).tokens == [8]
    # {8: 2, 9: 1, 7: 1}: 200 < 66*4 fails
    h = [3, 8, 3, 9, 3, 8, 3, 7, 5, 3]
    got = fresh(Cache, h, n_draft=1).draft(h, 16)
    assert got.tokens == [] and got.reason == "no-match"


def test_cache_sample_size_thresholds_per_ngram_size():
    # one observation is not enough for a 1-gram or 2-gram
    h = [3, 8, 5, 3]
    assert fresh(Cache, h).draft(h, 16).reason == "no-match"
    # but it is for a 3-gram: (5,4,3) -> 8
    h = [5, 4, 3, 8, 5, 4, 3]
    assert fresh(Cache, h, n_draft=1).draft(h, 16).tokens == [8]


def test_cache_prefers_the_longest_confident_ngram():
    # (2,3) -> {9: 2} wins; the 1-gram (3) -> {9: 2, 7: 3} would fail its 66% share anyway
    h = [2, 3, 9, 1, 3, 7, 2, 3, 9, 1, 3, 7, 1, 3, 7, 6, 2, 3]
    assert fresh(Cache, h, n_draft=1).draft(h, 16).tokens == [9]
    d = fresh(Cache, h)
    assert d.followers([2, 3]) == {9: 2}
    assert d.followers([3]) == {9: 2, 7: 3}


def test_cache_short_history():
    assert fresh(Cache, [5]).draft([5], 4).reason == "short-history"


def test_cache_dynamic_statistics_from_an_earlier_request():
    a = [3, 8] * 4 + [3]
    b = [50, 51, 3]
    d = fresh(Cache, a, n_draft=2)
    d.draft(a, 16)
    d.begin(b)  # a different request: a's statistics become dynamic ones
    assert d.followers([3], dynamic=True) == {8: 4}
    assert d.followers([3]) == {}
    # strict thresholds: (3) -> {8: 4} (4 >= 4 samples), then (3,8) -> {3: 4} (4 >= 3)
    assert d.draft(b, 16).tokens == [8, 3]
    # three observations are not enough for a dynamic 1-gram
    d3 = fresh(Cache, [3, 8] * 3 + [3], n_draft=2)
    d3.begin(b)
    got = d3.draft(b, 16)
    assert got.tokens == [] and got.reason == "no-match"


def test_cache_restore_or_continuation_does_not_merge():
    a = [3, 8] * 4 + [3]
    d = fresh(Cache, a)
    d.begin(a + [8, 3])  # continuation
    d.begin(a[:5])  # back to an earlier point
    assert d.followers([3], dynamic=True) == {}


def test_cache_unigram_share_threshold_is_66_percent():
    # token 3 always follows a new token (blocks [100+i, 3, f]), so only the 1-gram (3) can decide
    def history(n8, n9):
        out = []
        for i, f in enumerate([8] * n8 + [9] * n9):
            out += [100 + i, 3, f]
        return out + [200, 3]

    got = fresh(Cache, history(17, 9), n_draft=1).draft(history(17, 9), 4)
    assert got.tokens == [] and got.reason == "no-match"  # 17 of 26 = 65.4 %
    assert fresh(Cache, history(18, 9), n_draft=1).draft(history(18, 9), 4).tokens == [8]  # 18 of 27 = 66.7 %


def test_cache_a_shorter_confident_ngram_is_used_when_the_longer_one_is_not():
    # (2,3) -> {9, 7, 5} once each: 33 % fails; the 1-gram (3) -> {9, 7, 5, 8 x 6}: 6 of 9 passes
    h = [2, 3, 9, 2, 3, 7, 2, 3, 5] + [1, 3, 8] * 6 + [2, 3]
    d = fresh(Cache, h, n_draft=1)
    assert d.followers([2, 3]) == {9: 1, 7: 1, 5: 1}
    assert d.draft(h, 4).tokens == [8]


def test_cache_dynamic_statistics_are_consulted_from_the_first_two_tokens():
    # in request a, (7,8) is always followed by 9, but (8) by 5 and 9 equally (50 % < 75 %)
    a = [6, 8, 5, 7, 8, 9] * 4
    d = fresh(Cache, a, n_draft=1)
    b = [7, 8]  # a new request of two tokens: the whole of it is the 2-gram looked up
    d.begin(b)
    assert d.followers([7, 8], dynamic=True) == {9: 4}
    assert d.followers([8], dynamic=True) == {5: 4, 9: 4}
    assert d.draft(b, 4).tokens == [9]


def test_cache_dynamic_statistics_add_up_across_requests_and_survive_a_state_round_trip():
    a = [3, 8] * 4 + [3]
    b = [50, 3, 8, 3, 8, 3]
    c = [60, 61]
    d = fresh(Cache, a)
    d.begin(b)  # a new request: a's statistics become dynamic
    d.begin(c)  # another: b's are added to them
    # counted by hand, a's and b's together, every n-gram size
    expected = {
        (3,): {8: 6},
        (8,): {3: 6},
        (50,): {3: 1},
        (3, 8): {3: 6},
        (8, 3): {8: 4},
        (50, 3): {8: 1},
        (3, 8, 3): {8: 4},
        (8, 3, 8): {3: 4},
        (50, 3, 8): {3: 1},
        (3, 8, 3, 8): {3: 4},
        (8, 3, 8, 3): {8: 2},
        (50, 3, 8, 3): {8: 1},
    }
    assert {g: d.followers(g, dynamic=True) for g in expected} == expected
    state = json.loads(json.dumps(d.state()))
    r = fresh(Cache, c)
    r.load_state(state)
    assert {g: r.followers(g, dynamic=True) for g in expected} == expected
    assert r.state() == state
    # n-grams of 0 or 5 tokens cannot be in a cache state: refused, nothing changes
    for key in ([], [1, 2, 3, 4, 5]):
        with pytest.raises(SnapshotError, match="malformed"):
            r.load_state(dict(state, dynamic=state["dynamic"] + [[key, [[6, 1]]]]))
        assert r.state() == state


def test_cache_reads_and_writes_no_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import builtins

    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda *a, **k: opened.append(a) or real_open(*a, **k))
    h = [1, 2, 3, 4] * 10
    d = fresh(Cache, h)
    d.draft(h, 8)
    d.begin([9, 9, 9])
    d.draft([9, 9, 9], 8)
    assert opened == [] and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------
# begin() rebuild equivalence and state round trips
# ------------------------------------------------------------------------------------------------


def simulate(d, target, start, rounds, n_max, start_fresh=True):
    """Drive ``d`` like a session verifying against the fixed continuation ``target``.

    Returns the drafts and the final history length. Each round drafts on ``target[:L]``, accepts the
    matching prefix and commits it plus one target token.
    """
    L = start
    if start_fresh:
        d.begin(target[:L])
    drafts = []
    for _ in range(rounds):
        if L >= len(target):
            break
        got = d.draft(target[:L], n_max)
        drafts.append((L, list(got.tokens), got.reason))
        acc = 0
        while acc < len(got.tokens) and L + acc < len(target) and got.tokens[acc] == target[L + acc]:
            acc += 1
        L = min(len(target), L + acc + 1)
        if got.tokens:
            d.accept(acc, target[:L])
    return drafts, L


histories = st.lists(st.integers(0, 4), min_size=20, max_size=140)


@settings(max_examples=60, deadline=None)
@given(h=histories)
def test_cache_fresh_begin_equals_incremental(h):
    inc = fresh(Cache, h[:1])
    for L in range(2, len(h) + 1):
        got = inc.draft(h[:L], 8)
        inc.accept(0, h[:L])
        assert got.tokens == fresh(Cache, h[:L]).draft(h[:L], 8).tokens


def knob_strategy(name):
    if name in ("ngram-map-k", "ngram-map-k4v"):
        return st.fixed_dictionaries(
            {
                "size_n": st.integers(1, 3),
                "size_m": st.integers(1, 4),
                "min_hits": st.integers(1, 3),
                "check_rate": st.integers(1, 3),
            }
        )
    if name == "ngram-mod":
        return st.integers(1, 4).flatmap(
            lambda nmin: st.fixed_dictionaries(
                {
                    "n_match": st.integers(1, 3),
                    "n_min": st.just(nmin),
                    "n_max": st.integers(nmin, 6),
                    "pool_size": st.sampled_from([1024, 4096]),
                    "low_accept_streak": st.integers(1, 3),
                }
            )
        )
    return st.fixed_dictionaries({"n_draft": st.integers(1, 6)})


@pytest.mark.parametrize("name", ["ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_state_round_trip_continues_exactly(name, data):
    """A drafter restored from (history, state_dict) drafts exactly as the original, whichever order
    begin() and load_state() are called in; the state survives JSON."""
    knobs = data.draw(knob_strategy(name))
    target = data.draw(st.lists(st.integers(0, 3), min_size=40, max_size=260))
    start = data.draw(st.integers(1, 10))
    split = data.draw(st.integers(0, 30))
    n_max = data.draw(st.integers(1, 8))
    cls = strategy_class(name)

    orig = cls(**knobs)
    _, L = simulate(orig, target, start, split, n_max)
    state = json.loads(json.dumps(orig.state()))

    a = cls(**knobs)
    a.begin(target[:L])
    a.load_state(state)

    rest_orig, _ = simulate(orig, target, L, 40, n_max, start_fresh=False)
    assert simulate(a, target, L, 40, n_max, start_fresh=False)[0] == rest_orig
    if name.startswith("ngram-map"):
        # the map's state lists the slots it recorded as filled: exactly the filled slots of its index
        for d in (orig, a):
            filled = np.flatnonzero(d._index)
            assert d.state()["index"] == [[int(s), int(d._index[s])] for s in filled]
        assert a.state() == orig.state()


def test_map_state_restores_look_up_counts_that_begin_alone_cannot():
    h1 = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    d = fresh(MapK, h1, size_n=2, size_m=3, min_hits=2)
    assert d.draft(h1, 16).reason == "min-hits"
    state = d.state()  # saved at len(h1)
    h2 = h1 + [3, 0, 1, 2]
    restored = fresh(MapK, h1, size_n=2, size_m=3, min_hits=2)
    assert restored.draft(h2, 16).reason == "min-hits"  # begin alone: first look-up again
    restored = fresh(MapK, h1, size_n=2, size_m=3, min_hits=2)
    restored.load_state(state)
    assert restored.draft(h2, 16).tokens == d.draft(h2, 16).tokens == [3, 4, 5]


def test_map_state_taken_between_draft_and_accept_carries_the_pending_feedback():
    h1 = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    d = fresh(MapK, h1, size_n=2, size_m=3)
    assert d.draft(h1, 16).tokens == [3, 4, 5]
    r = fresh(MapK, h1, size_n=2, size_m=3)
    r.load_state(json.loads(json.dumps(d.state())))  # saved before the verdict came back
    h1b = h1 + [3, 0]
    r.accept(1, h1b)  # one accepted: the key drafted before the save is capped at one token
    assert r.draft(h1b + [1, 2], 16).tokens == [3]


def test_mod_state_restores_the_chunk_position():
    knobs = dict(n_match=3, n_min=1, n_max=5, pool_size=1 << 20)
    h = PROMPT + [8, 1, 2, 3]
    d = fresh(Mod, PROMPT, **knobs)
    state = d.state()
    r = fresh(Mod, h, **knobs)
    assert r.draft(h, 16).tokens == [4, 5, 6, 7, 8]  # begin alone added every n-gram before the pending 3
    r = fresh(Mod, PROMPT, **knobs)
    r.load_state(state)  # saved at len(PROMPT)
    assert r.draft(h, 16).tokens == d.draft(h, 16).tokens == [4, 5, 6]


def test_state_of_another_strategy_or_size_is_refused():
    h = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    state = fresh(MapK, h, size_n=2, size_m=3).state()
    with pytest.raises(SnapshotError):
        fresh(Mod, h).load_state(state)
    with pytest.raises(SnapshotError):
        fresh(MapK4V, h, size_n=2, size_m=3).load_state(state)
    with pytest.raises(SnapshotError):
        fresh(MapK, h, size_n=3, size_m=3).load_state(state)


def test_state_applies_to_extensions_of_the_saved_history_only():
    h = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    d = fresh(MapK, h, size_n=2, size_m=3, min_hits=2)
    d.draft(h, 16)
    state = d.state()
    assert state["n_history"] == len(h)
    r = fresh(MapK, h[:-1], size_n=2, size_m=3, min_hits=2)
    with pytest.raises(SnapshotError, match="history"):  # shorter than the saved history
        r.load_state(state)
    assert r.state()["keys"] == []  # refused: unchanged
    r = fresh(MapK, h + [3, 0], size_n=2, size_m=3, min_hits=2)
    r.load_state(state)  # tokens committed after the last call (no accept followed an empty draft)
    assert r.state()["keys"] == state["keys"]


def test_a_state_of_another_format_or_not_a_dict_is_refused():
    h = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    d = fresh(MapK, h, size_n=2, size_m=3)
    d.draft(h, 16)
    good = d.state()
    r = fresh(MapK, h, size_n=2, size_m=3)
    for bad in (dict(good, format="ngram-map/1"), [good], "state", None):  # an older format's fields fit
        with pytest.raises(SnapshotError):
            r.load_state(bad)
        assert r.state()["keys"] == []
    with pytest.raises(SnapshotError):  # a stateless drafter refuses another's state as well
        strategy_class("prompt-lookup")().load_state({"format": "ngram-mod/1", "n_history": 0})


def test_a_state_saved_before_any_history_applies_to_every_history():
    state = MapK(size_n=2, size_m=3).state()
    assert state["n_history"] == 0
    r = fresh(MapK, [7, 1, 2, 3, 4, 5, 9, 1, 2], size_n=2, size_m=3)
    r.load_state(state)
    assert r.state()["keys"] == []


def test_draftless_drafters_have_no_context_of_their_own():
    h = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    names = [n for n in strategy_names() if not strategy_class(n).needs_model]
    assert "ngram-mod" in names and "prompt-lookup" in names
    for name in names:
        d = fresh(strategy_class(name), h)
        assert not d.has_context
        assert context_hooks(d) is None  # no kv_length / sync / context_state to ask: nothing to keep in step


def test_a_malformed_map_or_mod_state_is_refused_and_changes_nothing():
    h = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    d = fresh(MapK, h, size_n=2, size_m=3)
    d.draft(h, 16)
    good = d.state()
    key = good["keys"][0]
    r = fresh(MapK, h, size_n=2, size_m=3)
    r.load_state(good)
    for bad in (
        dict(good, keys=[dict(key, values=key["values"][:3])]),  # three value slots, not four
        dict(good, keys=[dict(key, values=[v[:2] for v in key["values"]])]),  # slots of two numbers
        dict(good, index=[[-1, 5]]),  # a slot outside the index
        dict(good, index=[[3, 0]]),  # 0 marks an empty slot, never a position
        dict(good, index=[[3, -2]]),
    ):
        with pytest.raises(SnapshotError):
            r.load_state(bad)
        assert r.state() == good
    knobs = dict(n_match=3, n_min=1, n_max=5, pool_size=1 << 20)
    m = fresh(Mod, PROMPT, **knobs)
    good = m.state()
    assert (good["lo"], good["i_last"]) == (0, 3)
    with pytest.raises(SnapshotError):
        m.load_state(dict(good, lo=4))  # the pool range [4, 3) is backwards
    assert m.state() == good


def test_a_malformed_state_is_refused_and_changes_nothing():
    h = [7, 1, 2, 3, 4, 5, 9, 1, 2]
    d = fresh(MapK, h, size_n=2, size_m=3, min_hits=2)
    d.draft(h, 16)
    good = d.state()
    r = fresh(MapK, h, size_n=2, size_m=3, min_hits=2)
    r.load_state(good)
    bad = dict(good, keys=[{"tokens": [1, 2], "key_idx": "x"}])
    with pytest.raises(SnapshotError, match="malformed"):
        r.load_state(bad)
    assert r.state() == good


# ------------------------------------------------------------------------------------------------
# peek: the side-effect-free look-ahead the cost policy learns from in rounds it keeps plain
# ------------------------------------------------------------------------------------------------


def recorded(d):
    """A drafter's state but for the history length it belongs to (a peek, like a draft, reads the history)."""
    return {k: v for k, v in d.state().items() if k != "n_history"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    h=st.lists(st.integers(0, 5), min_size=1, max_size=80),
    check_rate=st.integers(1, 3),
    drafts=st.lists(st.booleans(), min_size=80, max_size=80),
)
def test_peek_is_the_first_draft_token_and_changes_nothing(h, check_rate, drafts):
    """At every length: the peek equals the first token of a one-token draft made by an exact copy of
    the drafter, and leaves the drafter as it was (its counters, its state, and every later draft of a
    twin that never peeked). Drafts happen in some rounds only, so a peek also meets the stretches a
    plain round leaves (ngram-mod's n-grams not added yet, a map's positions not indexed yet)."""
    for name, knobs in (
        ("prompt-lookup", {"max_ngram": 3, "min_ngram": 1}),
        ("ngram-simple", {"size_n": 2, "size_m": 4, "check_rate": check_rate}),
        ("ngram-map-k", {"size_n": 2, "size_m": 3, "check_rate": check_rate, "min_hits": 1 + check_rate % 2}),
        ("ngram-map-k4v", {"size_n": 2, "size_m": 3, "check_rate": check_rate, "min_hits": check_rate}),
        ("ngram-mod", {"n_match": 1 + check_rate, "n_min": check_rate, "n_max": 4, "pool_size": 1024}),
        ("ngram-cache", {"n_draft": 4}),
    ):
        cls = strategy_class(name)
        peeked, plain = fresh(cls, h[:1], **knobs), fresh(cls, h[:1], **knobs)
        for i in range(1, len(h) + 1):
            before, state = peeked.stats.to_dict(), recorded(peeked)
            twin = deepcopy(peeked)
            first = peeked.peek(h[:i])
            assert peeked.stats.to_dict() == before  # a peek is not a draft call
            assert recorded(peeked) == state  # nor does it record anything
            one = twin.draft(h[:i], 1)
            assert first == (one.tokens[0] if one.tokens else None), (name, i)
            if not drafts[i - 1]:
                continue
            d = peeked.draft(h[:i], 8)
            assert plain.draft(h[:i], 8).tokens == d.tokens  # peeking changed no state
            assert recorded(peeked) == recorded(plain)
            if i % 3 == 0 and d.tokens:  # the accepted count caps a map key's next draft: report some
                for x in (peeked, plain):
                    x.accept(len(d.tokens) // 2, h[:i])


def test_an_ngram_mod_peek_after_a_new_history_of_the_same_length_reads_that_history():
    """A peek extends the previous peek's hashes of the pending n-grams only where they came from the same
    tokens: after ``begin`` on the same prompt (the same pending start) another continuation's n-grams
    count, as a fresh drafter's one-token draft shows. The other continuation is peeked only beyond where
    the first one's peeks ended, where the earlier hashes would otherwise be extended."""
    rng = np.random.default_rng(3)
    base = [int(t) for t in rng.integers(0, 4, size=20)]
    a = base + [int(t) for t in rng.integers(0, 4, size=40)]
    b = base + [int(t) for t in rng.integers(0, 4, size=60)]
    d = fresh(Mod, base, n_match=2, n_min=1, n_max=4, pool_size=1024)
    for i in range(len(base) + 1, len(a) + 1):
        d.peek(a[:i])  # a plain stretch: the pending range grows by a token a peek
    d.begin(base)
    found = 0
    for i in range(len(a) + 1, len(b) + 1):
        got = d.peek(b[:i])
        one = fresh(Mod, base, n_match=2, n_min=1, n_max=4, pool_size=1024).draft(b[:i], 1).tokens
        assert got == (one[0] if one else None), i
        found += got is not None
    assert found, "nothing was ever proposed: the case proves nothing"


def test_an_ngram_mod_peek_sees_the_ngrams_a_draft_would_add_first():
    """Hand-worked: begin adds "1 2" -> 3. Plain rounds then bring "1 2" -> 7 and later "1 2" -> 8, more
    than ADD_CHUNK tokens past the last add, so a draft now would first add both (the later one wins the
    slot) and propose 8; the pool alone still says 3."""
    filler = list(range(100, 140))
    start = [1, 2, 3, *filler[:5]]
    h = [*start, 1, 2, 7, *filler[5:20], 1, 2, 8, *filler[20:40], 1, 2]
    d = fresh(Mod, start, n_match=2, n_min=1, n_max=4, pool_size=1024)
    assert int(d.pool[d.slot([1, 2])]) == 3
    assert d.peek(h) == 8
    assert int(d.pool[d.slot([1, 2])]) == 3  # nothing was added
    assert d.draft(h, 1).tokens == [8]


@pytest.mark.parametrize("cls", [MapK, MapK4V])
def test_map_states_taken_every_round_match_the_index_and_stay_as_taken(cls):
    """state() is kept up to date as slots fill and shares what has not changed between rounds: each
    round's state must list exactly the index's filled slots, in slot order, and the keys as they are;
    and a state taken earlier must not change when later rounds fill slots or count keys."""
    rng = np.random.default_rng(5)
    motif = rng.integers(3, 40, size=30).tolist()
    history = (motif * 3)[:70]
    d = fresh(cls, history, size_n=2, size_m=6, min_hits=1)
    taken = []
    for step in range(60):
        draft = d.draft(history, 6)
        if step % 2:
            d.state()  # between a draft and its accept too (a snapshot may be taken there)
        n_acc = len(draft.tokens) // 2 if draft.tokens else 0
        nxt = [*draft.tokens[:n_acc], int(rng.integers(3, 40)) if step % 3 == 0 else motif[len(history) % 30]]
        history = history + nxt
        if draft.tokens:
            d.accept(n_acc, history)
        st = d.state()
        used = np.flatnonzero(d._index)
        assert st["index"] == [[int(s), int(d._index[s])] for s in used]
        assert [k["tokens"] for k in st["keys"]] == [list(k) for k in d._keys]
        assert [k["values"] for k in st["keys"]] == [r.values for r in d._keys.values()]
        assert [k["key_num"] for k in st["keys"]] == [r.key_num for r in d._keys.values()]
        taken.append((st, json.loads(json.dumps(st))))
    assert any(st["keys"] for st, _ in taken) and len(taken[-1][0]["index"]) > len(taken[0][0]["index"])
    for st, copy in taken:
        assert json.loads(json.dumps(st)) == copy  # later rounds changed no earlier state
    last = taken[-1][0]
    r = fresh(cls, history[: last["n_history"]], size_n=2, size_m=6, min_hits=1)
    r.load_state(last)
    assert r.state() == last


@pytest.mark.parametrize("cls", [MapK, MapK4V])
def test_map_index_is_the_same_one_position_at_a_time_and_vectorised(cls, monkeypatch):
    """A round's few new positions are indexed in plain Python, a long range with NumPy: both must fill
    the same slots with the same positions (collisions included: the newest position of a range wins).
    ngram-map-k4v's value counts over a short range are plain Python too: the same counts as NumPy's."""
    import specviz.strategies.ngram_map as nm

    rng = np.random.default_rng(11)
    motif = rng.integers(3, 30, size=25).tolist()
    start = (motif * 4)[:90]

    def states(small_range, prompt=start):
        monkeypatch.setattr(nm, "SMALL_RANGE", small_range)
        d = fresh(cls, prompt, size_n=2, size_m=5, min_hits=1)
        h, out = list(prompt), []
        for step in range(40):
            draft = d.draft(h, 5)
            grow = [motif[(len(h) + step + i) % 25] for i in range(1 + step % 5)]  # 1-5 new positions a round
            h = h + [*draft.tokens[:1], *grow]
            if draft.tokens:
                d.accept(min(1, len(draft.tokens)), h)
            out.append(json.dumps(d.state(), sort_keys=True))
        return out

    small_range = nm.SMALL_RANGE
    assert small_range >= 2
    assert states(small_range) == states(0)
    # a short prompt and a tiny index: the rounds fill the slots, and positions of one range collide
    monkeypatch.setattr(nm, "INDEX_SIZE", 13)
    assert states(small_range, motif[:14]) == states(0, motif[:14])
