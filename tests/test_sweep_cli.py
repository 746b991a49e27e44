"""``specviz sweep`` and ``specviz report`` on the command line: option errors before any model loads, a run."""

from __future__ import annotations

import json

import pytest

from specviz.cli import main as cli

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

BAD = [
    (["sweep", "poetry", "-o", "{out}"], "DATASET", "'poetry'"),
    (["sweep", "{tmp}/q.csv", "-o", "{out}"], "DATASET", "expected a .jsonl file"),
    (["sweep", "free"], "-o", "required"),
    (["sweep", "free", "-o", "/nonexistent/r.parquet"], "-o", "does not exist"),
    (["sweep", "free", "-o", "{tmp}/r.csv"], "-o", "'{tmp}/r.csv'"),
    (["sweep", "free", "-o", "{out}", "--strategy", "magic"], "--strategy", "'magic'"),
    (["sweep", "free", "-o", "{out}", "--strategy", "draft"], "--strategy", "--draft-model"),
    (["sweep", "free", "-o", "{out}", "--draft-model", "/nonexistent.gguf"], "--draft-model", "does not exist"),
    (["sweep", "free", "-o", "{out}", "--knob", "draft_max=0,4"], "--knob draft_max", "[1, 1024]"),
    (["sweep", "free", "-o", "{out}", "--knob", "draft_max"], "--knob", "NAME=V1,V2"),
    (
        ["sweep", "free", "-o", "{out}", "--knob", "size_n=3", "--strategy", "prompt-lookup"],
        "--knob size_n",
        "no strategy in the grid",
    ),
    (
        ["sweep", "free", "-o", "{out}", "--knob", "prompt-lookup:max_ngram=99"],
        "--knob prompt-lookup:max_ngram",
        "[1, 64]",
    ),
    (["sweep", "free", "-o", "{out}", "--temperature", "hot"], "--temperature", "'hot'"),
    (["sweep", "free", "-o", "{out}", "--max-tokens", "0"], "--max-tokens", "'0'"),
    (["sweep", "free", "-o", "{out}", "--repeats", "x"], "--repeats", "'x'"),
    (["sweep", "free", "-o", "{out}", "--workers", "0"], "--workers", "'0'"),
    (["sweep", "free", "-o", "{out}", "--threads", "-1"], "--threads", "'-1'"),
    (["sweep", "free", "-o", "{out}", "--n-ctx", "8"], "--n-ctx", "'8'"),
    (["sweep", "free", "-o", "{out}", "--cluster", "remote:2"], "--cluster", "local:N"),
    (["sweep", "free", "-o", "{out}", "--cluster", "local:0"], "--cluster", "local:N"),
    (["sweep", "free", "-o", "{out}", "--scheduler", "a b"], "--scheduler", "'a b'"),
    (["sweep", "free", "-o", "{out}", "--workers", "2", "--cluster", "local:2"], "--cluster", "not allowed with"),
    (["sweep", "free", "-o", "{out}", "--prompt-format", "jinja"], "--prompt-format", "auto, chat, plain"),
    (["sweep", "free", "-o", "{out}", "--model", "/nonexistent.gguf"], "--model", "does not exist"),
    (["sweep", "free", "-o", "{out}", "--grid", "/nonexistent.toml"], "--grid", "does not exist"),
    (["sweep", "free", "-o", "{out}", "--grid", "{tmp}/bad.toml"], "--grid", "unknown key 'colour'"),
    (["sweep", "{tmp}/bad.jsonl", "-o", "{out}"], "bad.jsonl:2", "not valid JSON"),
    (["report", "/nonexistent.parquet"], "RESULTS", "does not exist"),
    (["report", "{tmp}/r.parquet", "-o", "{tmp}/r.pdf"], "-o", ".html"),
]


@pytest.mark.parametrize("argv,option,detail", BAD, ids=[f"{a[0]} {o}: {d}" for a, o, d in BAD])
def test_bad_options_exit_2_with_one_line_before_loading(argv, option, detail, tmp_path, capsys, monkeypatch):
    import specviz.models.embedded as models
    import specviz.sweep.chat as chat
    import specviz.sweep.execution as execution

    def poisoned(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(models, "default_model_path", poisoned)
    monkeypatch.setattr(chat, "probe_format", poisoned)
    monkeypatch.setattr(execution, "run_sweep", poisoned)  # a refused option never reaches the sweep
    (tmp_path / "bad.toml").write_text('colour = "blue"\n')
    (tmp_path / "bad.jsonl").write_text('{"question_id": 1, "turns": ["ok"]}\n{oops\n')
    (tmp_path / "r.parquet").write_bytes(b"")
    args = [a.format(tmp=tmp_path, out=tmp_path / "out.parquet") for a in argv]
    code = cli.main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert option in err and detail.format(tmp=tmp_path) in err, err
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.slow
def test_skip_bad_lines_warns_per_line(tmp_path, tiny_model_path, capsys):
    q = tmp_path / "q.jsonl"
    q.write_text('{"question_id": 1, "turns": ["Once upon a time"]}\n{oops\n{"question_id": 2, "turns": ["x"]}\n')
    code = cli.main(
        [
            "sweep",
            str(q),
            "-o",
            str(tmp_path / "r.parquet"),
            "--model",
            str(tiny_model_path),
            "--strategy",
            "none",
            "--max-tokens",
            "4",
            "--workers",
            "1",
            "--threads",
            "1",
            "--no-progress",
            "--skip-bad-lines",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"warning: refused {q}:2: not valid JSON" in err and "2 of 2 runs stored" in err


@pytest.mark.slow
def test_sweep_on_a_local_cluster_and_report_from_the_command_line(tiny_model_path, tmp_path, capsys):
    pytest.importorskip("distributed", reason="Dask is the optional extra specviz[cluster]")
    grid = tmp_path / "grid.toml"
    grid.write_text('strategies = ["prompt-lookup"]\nmax_tokens = 16\n[knobs]\ndraft_max = [3, 5]\n')
    out = tmp_path / "r.parquet"
    argv = [
        "sweep",
        "quote",
        "-o",
        str(out),
        "--model",
        str(tiny_model_path),
        "--grid",
        str(grid),
        "--cluster",
        "local:2",
        "--threads",
        "1",
        "--no-progress",
    ]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "on Dask LocalCluster, 2 worker processes" in captured.err
    assert "12 of 12 runs stored (0 from before, 12 new)" in captured.err
    assert "prompt-lookup draft_max=5" in captured.out and "quote" in captured.out
    rerun = argv[: argv.index("--cluster")] + ["--workers", "1", "--threads", "1", "--no-progress"]
    assert cli.main(rerun) == 0  # again, here on local workers: everything is already there
    assert "12 of 12 runs stored (12 from before, 0 new)" in capsys.readouterr().err
    assert cli.main(["report", str(out), "-o", str(tmp_path / "r.html")]) == 0
    assert "speedup over none per category" in capsys.readouterr().out
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    summary = json.loads(page.split('id="specviz-summary">')[1].split("</script>")[0].replace("&quot;", '"'))
    assert {r["setting"] for r in summary} == {"none", "prompt-lookup draft_max=3", "prompt-lookup draft_max=5"}
