"""A sweep under a deployment's context settings: every task's session gets them, rows record them, and a
results file made under other settings is not resumed (one made before the column existed stands for
the defaults)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from conftest import TINY  # noqa: E402
from test_cli import run_cli  # noqa: E402
from test_sweep_run import QUESTIONS, sweep  # noqa: E402

from specviz.sweep import GridSpec, build_grid, load_dataset, read_results  # noqa: E402
from specviz.sweep.results import ResumeError  # noqa: E402
from specviz.testing.tiny_models import write_tiny_llama  # noqa: E402

Q8 = {"flash_attn": "on", "cache_type_k": "q8_0", "cache_type_v": "q8_0", "n_batch": 256, "n_ubatch": 128}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("sw-wide") / "wide.gguf", n_head=2, n_head_kv=1, **TINY)


@pytest.fixture()
def questions(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in QUESTIONS[:2]) + "\n")
    return path


def grid():
    return build_grid(GridSpec(strategies=["ngram-simple"], max_tokens=16))


def test_rows_record_the_settings_and_another_context_is_not_resumed(wide, questions, tmp_path):
    out = tmp_path / "r.parquet"
    sweep(load_dataset(str(questions)), grid(), out, wide, context=Q8)
    df = read_results(out)
    assert set(df["context"]) == {"-fa on -ctk q8_0 -ctv q8_0 -b 256 -ub 128"}
    with pytest.raises(ResumeError, match="context"):
        sweep(load_dataset(str(questions)), grid(), out, wide)
    # the same settings resume (nothing left to run)
    assert sweep(load_dataset(str(questions)), grid(), out, wide, context=Q8).new_rows == 0


def test_the_settings_change_what_the_tasks_run(wide, questions, tmp_path):
    """The q8_0 cache's rows are those of a session with that cache (not of the defaults)."""
    from specviz import Session

    out = tmp_path / "r.parquet"
    sweep(load_dataset(str(questions)), grid(), out, wide, context=Q8)
    row = read_results(out).query("question_id == '1'").iloc[0]
    s = Session(wide, n_ctx=4096, n_threads=1, **Q8)
    ids = s.model.tokenize(QUESTIONS[0]["turns"][0])
    s.start(ids, 16, row["strategy"], **json.loads(row["knobs"]))
    s.run()
    assert list(row["tokens"])[: len(s.tokens)] == s.tokens
    s.close()


def test_a_file_from_before_the_column_stands_for_the_defaults(wide, questions, tmp_path):
    import pandas as pd

    out = tmp_path / "r.parquet"
    sweep(load_dataset(str(questions)), grid(), out, wide)
    df = read_results(out).drop(columns=["context"])
    df.to_parquet(out, index=False)
    assert sweep(load_dataset(str(questions)), grid(), out, wide).new_rows == 0
    assert isinstance(pd.read_parquet(out), pd.DataFrame)


@pytest.mark.slow
def test_sweep_settings_on_the_command_line(wide, questions, tmp_path, tiny_model_path):
    p = run_cli("sweep", str(questions), "-o", str(tmp_path / "a.parquet"), "-ctv", "q8_0", "-fa", "off")
    assert p.returncode == 2 and "option -ctv/--cache-type-v" in p.stderr
    p = run_cli(
        "sweep", str(questions), "-o", str(tmp_path / "a.parquet"), "--model", str(tiny_model_path), "-ctk", "q4_0"
    )
    assert p.returncode == 2 and "head size 16" in p.stderr


@pytest.mark.slow
def test_a_sweep_places_the_model_in_every_worker_and_rows_record_it(wide, questions, tmp_path):
    """-ngl reaches every worker's model (a worker that loaded it elsewhere could not make the session) and the
    context column, so a file of CPU rows is not resumed with the model on a GPU; a CPU build says it."""
    from specviz.backends.devices import gpu_devices

    out = tmp_path / "g.parquet"
    p = run_cli(
        "sweep",
        str(questions),
        "-o",
        str(out),
        "--model",
        str(wide),
        "--strategy",
        "ngram-simple",
        "--max-tokens",
        "16",
        "--threads",
        "1",
        "--workers",
        "1",
        "--no-progress",
        "-ngl",
        "3",
    )
    assert p.returncode == 0, p.stderr
    df = read_results(out)
    assert len(df) == 4 and set(df["context"]) == {"-fa auto -ctk f16 -ctv f16 -b 512 -ub 512 -ngl 3"}
    if not gpu_devices():
        assert "option -ngl 3 is accepted but puts nothing on a GPU" in p.stderr
    with pytest.raises(ResumeError, match="context"):
        sweep(load_dataset(str(questions)), grid(), out, wide)
    assert sweep(load_dataset(str(questions)), grid(), out, wide, context={"n_gpu_layers": 3}).new_rows == 0
    p = run_cli("sweep", str(questions), "-o", str(tmp_path / "b.parquet"), "-ngl", "some")
    assert p.returncode == 2 and "option -ngl: 'some' is not allowed" in p.stderr
