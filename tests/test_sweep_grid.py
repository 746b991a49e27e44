"""The sweep grid: strategies x knob values x temperatures x draft models, none always in, refusals named."""

from __future__ import annotations

import pytest

from specviz.sweep.grid import GridError, GridSpec, build_grid, default_strategies, parse_knob_flag, read_grid_file


def labels(grid):
    return [s.label for s in grid.settings]


def test_product_of_knob_values_per_strategy_with_none_first_at_each_temperature():
    g = build_grid(
        GridSpec(
            strategies=["prompt-lookup", "ngram-simple"],
            knobs={"draft_max": ["4", "8"], "prompt-lookup": {"max_ngram": [2, 3]}},
            temperatures=["0", "0.7"],
            max_tokens="64",
            repeats="2",
            seed="5",
        )
    )
    assert labels(g) == [
        "none",
        "prompt-lookup draft_max=4 max_ngram=2",
        "prompt-lookup draft_max=4 max_ngram=3",
        "prompt-lookup draft_max=8 max_ngram=2",
        "prompt-lookup draft_max=8 max_ngram=3",
        "ngram-simple draft_max=4",
        "ngram-simple draft_max=8",
        "none T=0.7",
        "prompt-lookup draft_max=4 max_ngram=2 T=0.7",
        "prompt-lookup draft_max=4 max_ngram=3 T=0.7",
        "prompt-lookup draft_max=8 max_ngram=2 T=0.7",
        "prompt-lookup draft_max=8 max_ngram=3 T=0.7",
        "ngram-simple draft_max=4 T=0.7",
        "ngram-simple draft_max=8 T=0.7",
    ]
    assert (g.max_tokens, g.repeats, g.seed) == (64, 2, 5)
    assert g.at(0.7)[0].is_baseline and g.temperatures() == [0.0, 0.7]
    assert g.settings[1].knob_dict == {"draft_max": 4, "max_ngram": 2}  # converted to the knobs' types
    assert len({s.key for s in g.settings}) == len(g.settings)


def test_none_is_always_included_and_the_default_is_every_draftless_strategy():
    assert labels(build_grid(GridSpec(strategies=["none"]))) == ["none"]
    assert [s.strategy for s in build_grid(GridSpec()).settings] == ["none"] + [
        s for s in default_strategies() if s != "none"
    ]


def test_each_draft_model_is_a_setting(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"x")
    b.write_bytes(b"x")
    g = build_grid(GridSpec(strategies=["prompt-lookup"], draft_models=[str(a), str(b)], knobs={"draft_max": [3]}))
    assert [(s.strategy, s.knob_dict) for s in g.settings] == [
        ("none", {}),
        ("prompt-lookup", {"draft_max": 3}),
        ("draft", {"draft_max": 3, "draft_model": str(a)}),
        ("draft", {"draft_max": 3, "draft_model": str(b)}),
    ]


@pytest.mark.parametrize(
    "spec,option,detail",
    [
        (GridSpec(strategies=["magic"]), "--strategy", "'magic' is not allowed"),
        (GridSpec(strategies=["draft"]), "--strategy", "needs a draft model"),
        (GridSpec(draft_models=["/nonexistent.gguf"]), "--draft-model", "does not exist"),
        (GridSpec(strategies=["prompt-lookup"], knobs={"draft_max": ["0"]}), "--knob draft_max", "[1, 1024]"),
        (GridSpec(strategies=["prompt-lookup"], knobs={"size_n": [3]}), "--knob size_n", "no strategy in the grid"),
        (
            GridSpec(strategies=["ngram-simple"], knobs={"prompt-lookup": {"max_ngram": [2]}}),
            "--knob prompt-lookup",
            "not in the grid",
        ),
        (
            GridSpec(strategies=["prompt-lookup"], knobs={"prompt-lookup": {"size_n": [2]}}),
            "--knob prompt-lookup:size_n",
            "has no knob 'size_n'",
        ),
        (GridSpec(strategies=["prompt-lookup"], knobs={"min_ngram": [3], "max_ngram": [2]}), "--knob", "min_ngram"),
        (GridSpec(strategies=["prompt-lookup"], knobs={"draft_min": [9], "draft_max": [4]}), "--knob", "draft_min 9"),
        (GridSpec(strategies=["prompt-lookup"], knobs={"draft_max": []}), "--knob draft_max", "empty list"),
        (GridSpec(temperatures=["-1"]), "--temperature", "[0, 100]"),
        (GridSpec(max_tokens="0"), "--max-tokens", "'0'"),
        (GridSpec(repeats="many"), "--repeats", "'many'"),
        (GridSpec(strategies=["prompt-lookup"], knobs={"draft_model": ["x"]}), "--knob", "--draft-model"),
    ],
)
def test_refusals_name_the_option_the_value_and_what_is_allowed(spec, option, detail):
    with pytest.raises(GridError) as e:
        build_grid(spec)
    assert str(e.value).startswith(f"option {option}") and detail in str(e.value), str(e.value)


def test_knob_flag_syntax():
    assert parse_knob_flag("draft-max=4,8") == (None, "draft_max", ["4", "8"])
    assert parse_knob_flag("prompt-lookup:max_ngram=2") == ("prompt-lookup", "max_ngram", ["2"])
    for bad in ("draft_max", "draft_max=", "=4", "draft_max=4,,8"):
        with pytest.raises(GridError, match="--knob"):
            parse_knob_flag(bad)


GRID_TOML = """
strategies = ["prompt-lookup"]
temperatures = [0.0, 0.5]
draft_models = ["draft.gguf"]
max_tokens = 32
repeats = 2

[knobs]
draft_max = [4, 8]

[knobs.prompt-lookup]
max_ngram = [3]
"""

GRID_YAML = """
strategies: [prompt-lookup]
temperatures: [0.0, 0.5]
draft_models: [draft.gguf]
max_tokens: 32
repeats: 2
knobs:
  draft_max: [4, 8]
  prompt-lookup:
    max_ngram: [3]
"""


@pytest.mark.parametrize("name,text", [("grid.toml", GRID_TOML), ("grid.yaml", GRID_YAML)])
def test_grid_file_toml_and_yaml(tmp_path, name, text):
    if name.endswith(".yaml"):
        pytest.importorskip("yaml", reason="PyYAML reads YAML grids")
    (tmp_path / "draft.gguf").write_bytes(b"x")  # relative to the grid file's folder
    (tmp_path / name).write_text(text)
    g = build_grid(read_grid_file(tmp_path / name))
    assert (g.max_tokens, g.repeats) == (32, 2)
    assert labels(g)[:4] == [
        "none",
        "prompt-lookup draft_max=4 max_ngram=3",
        "prompt-lookup draft_max=8 max_ngram=3",
        f"draft draft_max=4 draft_model={tmp_path / 'draft.gguf'}",
    ]
    assert len(g.settings) == 10 and g.temperatures() == [0.0, 0.5]


@pytest.mark.parametrize(
    "text,detail",
    [("bogus = 1", "unknown key 'bogus'"), ("strategies = [", "cannot be parsed"), ("knobs = 3", "expected a table")],
)
def test_bad_grid_file_is_refused(tmp_path, text, detail):
    (tmp_path / "g.toml").write_text(text)
    with pytest.raises(GridError, match="--grid") as e:
        build_grid(read_grid_file(tmp_path / "g.toml"))
    assert detail in str(e.value)


def test_the_examples_grid_and_questions_used_in_the_readme():
    from browser_util import ROOT

    from specviz.sweep import load_dataset

    g = build_grid(read_grid_file(ROOT / "examples" / "sweep_grid.toml"))
    assert labels(g) == [
        "none",
        "prompt-lookup draft_max=8 max_ngram=2",
        "prompt-lookup draft_max=8 max_ngram=3",
        "prompt-lookup draft_max=16 max_ngram=2",
        "prompt-lookup draft_max=16 max_ngram=3",
        "ngram-simple draft_max=8",
        "ngram-simple draft_max=16",
    ]
    ds = load_dataset(str(ROOT / "examples" / "sweep_questions.jsonl"))
    assert len(ds) == 8 and {p.category for p in ds.prompts} == {"writing", "extraction", "coding", "reasoning"}
    assert sum(len(p.turns) == 2 for p in ds.prompts) == 3
