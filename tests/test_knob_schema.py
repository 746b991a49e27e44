"""The knob schema's rules between knobs (specviz.decoding.knob_schema.check_cross_knobs)."""

from __future__ import annotations

import pytest

from specviz import strategy_schema
from specviz.decoding.knob_schema import check_cross_knobs
from specviz.errors import KnobError


def test_draft_min_may_not_exceed_draft_max():
    cfg = strategy_schema("prompt-lookup").validate({"draft_min": 4, "draft_max": 4})
    check_cross_knobs(cfg)  # equal is fine
    with pytest.raises(KnobError, match="'draft_min': 5 is larger than draft_max=4") as e:
        check_cross_knobs({**cfg, "draft_min": 5})
    assert (e.value.knob, e.value.value) == ("draft_min", 5)


def test_a_strategy_without_the_draft_length_knobs_passes():
    check_cross_knobs(strategy_schema("none").validate({}))
