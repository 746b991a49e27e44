"""The ranged-integer rule of the knob schema (:func:`specviz.decoding.knob_schema.ranged_int`): what it
accepts and refuses, its words, and that integer knobs, the command line and the sweep grids all use it; and the
rules between knobs (:func:`specviz.decoding.knob_schema.check_cross_knobs`)."""

from __future__ import annotations

import numpy as np
import pytest

from specviz import strategy_schema
from specviz.decoding.knob_schema import Knob, check_cross_knobs, int_range_text, ranged_int
from specviz.errors import KnobError
from specviz.sweep.grid import GridError, GridSpec, build_grid


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5), ("5", 5), (" 7 ", 7), ("+3", 3), (4.0, 4), (np.int64(9), 9), (1, 1), (16, 16)],
)
def test_ranged_int_accepts_integers_and_their_text(value, expected):
    got = ranged_int(value, 1, 16)
    assert got == expected and type(got) is int


@pytest.mark.parametrize("value", [True, False, "4.0", "four", "", None, 4.5, [4], float("nan"), 0, 17, "-1"])
def test_ranged_int_refuses_with_the_value_and_the_range(value):
    with pytest.raises(KnobError) as e:
        ranged_int(value, 1, 16, label="option --draft-max", knob="draft_max")
    assert str(e.value) == f"option --draft-max: {value!r} is not allowed; expected an integer in [1, 16]"
    assert (e.value.knob, e.value.value) == ("draft_max", value)


def test_ranged_int_without_a_label_starts_at_the_value():
    with pytest.raises(KnobError) as e:
        ranged_int("x", 0, 9)
    assert str(e.value) == "'x' is not allowed; expected an integer in [0, 9]"


@pytest.mark.parametrize(
    ("lo", "hi", "text"),
    [
        (1, 65535, "an integer in [1, 65535]"),
        (1, None, "an integer >= 1"),
        (None, 3, "an integer <= 3"),
        (None, None, "an integer"),
    ],
)
def test_int_range_text_and_one_sided_bounds(lo, hi, text):
    assert int_range_text(lo, hi) == text
    with pytest.raises(KnobError, match=text.replace("[", r"\[").replace("]", r"\]")):
        ranged_int("nope", lo, hi)
    if lo is None:
        assert ranged_int(-(10**30), lo, hi) == -(10**30)
    if hi is None:
        assert ranged_int(10**30, lo, hi) == 10**30


def test_strict_takes_only_integral_numbers():
    """The inspector's JSON messages: an integer is a number, never its text or a float."""
    assert ranged_int(12, 1, 100, strict=True) == 12
    assert ranged_int(np.int32(3), 1, 100, strict=True) == 3
    for value in ("12", 12.0, True):
        with pytest.raises(KnobError):
            ranged_int(value, 1, 100, strict=True)


@pytest.mark.parametrize("value", [8, "8", 8.0, " 8", 0, 2000, "8.0", True, 2.5, None])
def test_integer_knobs_follow_the_same_rule(value):
    knob = Knob("draft_max", int, 16, "", lo=1, hi=1024)
    try:
        want: object = ranged_int(value, 1, 1024)
    except KnobError as e:
        want = str(e)
    try:
        got: object = knob.convert(value)
    except KnobError as e:
        got = str(e).replace("knob 'draft_max': ", "", 1)
        assert e.knob == "draft_max"
    assert got == want


def test_the_grid_follows_the_same_rule():
    """max_tokens/repeats/seed of a grid: what the knobs accept (an integral 4.0 too), refused in the grid's words."""
    g = build_grid(GridSpec(strategies=["none"], max_tokens=64.0, repeats=" 2 ", seed=np.int64(5)))
    assert (g.max_tokens, g.repeats, g.seed) == (64, 2, 5)
    with pytest.raises(GridError) as e:
        build_grid(GridSpec(strategies=["none"], repeats=2.5))
    assert str(e.value) == "option --repeats: 2.5 is not allowed; expected an integer in [1, 1000]"


def test_the_command_line_follows_the_same_rule():
    """An integer option: the rule's text forms (blanks, a sign), refused as a usage error in the CLI's words."""
    from specviz.cli.options import UsageError, int_option

    assert int_option("--port", " 8080 ", 1, 65535) == 8080
    assert int_option("--seed", "+3", 0, 9) == 3
    with pytest.raises(UsageError) as e:
        int_option("--port", "80.0", 1, 65535)
    assert str(e.value) == "option --port: '80.0' is not allowed; expected an integer in [1, 65535]"
    with pytest.raises(UsageError) as e:
        int_option("--train-steps", "0", 1)
    assert str(e.value) == "option --train-steps: '0' is not allowed; expected an integer >= 1"


def test_draft_min_may_not_exceed_draft_max():
    cfg = strategy_schema("prompt-lookup").validate({"draft_min": 4, "draft_max": 4})
    check_cross_knobs(cfg)  # equal is fine
    with pytest.raises(KnobError, match="'draft_min': 5 is larger than draft_max=4") as e:
        check_cross_knobs({**cfg, "draft_min": 5})
    assert (e.value.knob, e.value.value) == ("draft_min", 5)


def test_a_strategy_without_the_draft_length_knobs_passes():
    check_cross_knobs(strategy_schema("none").validate({}))


def test_free_text_knob_is_not_described_as_a_number():
    # A path knob (the draft model's) was once described in `specviz run --help` as "a number in [-inf, inf]".
    path = Knob("draft_model", str, "", "path of the draft GGUF")
    assert path.describe_range() == "any text"
    assert path.convert("m.gguf") == "m.gguf"
    with pytest.raises(KnobError, match="any text"):
        path.convert(3)
