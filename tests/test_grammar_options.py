"""Grammars wherever a request is made: the CLI's llama.cpp spellings (``--grammar``, ``--grammar-file``,
``-j`` / ``--json-schema``, ``-jf``), a ``--server-args`` line and a request log's structured-output fields.
A grammar llama.cpp refuses exits 2 with its reason and line, before any model loads."""

from __future__ import annotations

import json

import pytest

from specviz.analysis.server_args import parse_server_args
from specviz.cli import main as cli
from specviz.errors import GrammarError
from specviz.sweep.request_log import parse_request

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def _no_model_loads(monkeypatch):
    import specviz.models.embedded as models

    monkeypatch.setattr(models, "default_model_path", lambda: (_ for _ in ()).throw(AssertionError("model loaded")))


@pytest.mark.parametrize(
    "extra,detail",
    [
        (["--grammar", 'root ::= "a" (\nb ::= "c"'], "expecting ')' at '::= \"c\"' (line 2"),
        (["-j", '{"type": "object",\n "properties": {'], "line 2, column 17"),
        (["--json-schema", '{"$ref": "https://example.com/x.json"}'], "Fetching remote schemas"),
        (["--grammar-file", "/nonexistent/g.gbnf"], "cannot read"),
    ],
)
def test_a_refused_grammar_exits_2_with_llama_cpps_reason_before_any_model_loads(extra, detail, capsys, monkeypatch):
    _no_model_loads(monkeypatch)
    code = cli.main(["run", "--prompt", "x", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert extra[0] in err and detail in err, err


def test_two_grammar_options_are_refused(capsys):
    assert cli.main(["run", "--prompt", "x", "--grammar", 'root ::= "a"', "-j", "{}"]) == 2
    assert "not allowed with" in capsys.readouterr().err


@pytest.mark.slow
def test_run_under_a_schema_file_gives_json(tiny_model_path, tmp_path, capsys):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))
    args = ["run", "--model", str(tiny_model_path), "--prompt", "the cat", "--max-tokens", "24"]
    code = cli.main([*args, "-jf", str(path), "--strategy", "ngram-simple", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["text"].startswith("{") and '"a"' in out["text"]


def test_a_server_line_carries_its_grammar():
    cfg = parse_server_args(["llama-server", "-m", "m.gguf", "--spec-type", "ngram-simple", "-j", json.dumps(SCHEMA)])
    assert cfg.grammar is not None and "root ::=" in cfg.grammar
    assert cfg.start_kwargs()["grammar"] == cfg.grammar
    assert not any("schema" in w for w in cfg.warnings)
    assert parse_server_args(["--grammar", 'root ::= "x"']).grammar == 'root ::= "x"'
    with pytest.raises(GrammarError, match="option --grammar: .*Undefined rule identifier 'y'"):
        parse_server_args(["--grammar", "root ::= y"])


@pytest.mark.parametrize(
    "fields",
    [
        {"json_schema": SCHEMA},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}},
        {"response_format": {"type": "json_object", "schema": SCHEMA}},
    ],
)
def test_a_logged_requests_schema_becomes_its_grammar(fields):
    req = parse_request({"messages": [{"role": "user", "content": "hi"}], **fields}, "r")
    assert "name-kv" in req.options["grammar"]


def test_a_logged_request_with_any_json_or_a_grammar():
    msgs = [{"role": "user", "content": "hi"}]
    any_json = parse_request({"messages": msgs, "response_format": {"type": "json_object"}}, "r")
    assert "object" in any_json.options["grammar"]
    assert "grammar" not in parse_request({"messages": msgs, "response_format": {"type": "text"}}, "r").options
    assert parse_request({"messages": msgs, "grammar": 'root ::= "x"'}, "r").options["grammar"] == 'root ::= "x"'
    with pytest.raises(ValueError, match="takes one of them"):
        parse_request({"messages": msgs, "grammar": 'root ::= "x"', "json_schema": SCHEMA}, "r")
    with pytest.raises(ValueError, match="Undefined rule"):
        parse_request({"messages": msgs, "grammar": "root ::= y"}, "r")
    with pytest.raises(ValueError, match="response_format"):
        parse_request({"messages": msgs, "response_format": {"type": "xml"}}, "r")


@pytest.mark.slow
def test_a_sweep_under_a_grammar_records_it_and_resumes_only_with_it(tiny_model_path, tmp_path):
    from specviz.sweep import GridSpec, LocalExecutor, ResumeError, build_grid, load_dataset, read_results, run_sweep
    from specviz.sweep.worker import grammar_label

    log = tmp_path / "requests.jsonl"
    ask = {"messages": [{"role": "user", "content": "the cat of the dog"}]}
    lines = [dict(ask, id="free"), dict(ask, id="json", json_schema={"type": "object"})]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    words = 'root ::= (" the" | " a" | " of")+'
    grid = build_grid(GridSpec(strategies=["ngram-simple"], knobs={}, temperatures=[0], max_tokens=12))
    out = tmp_path / "r.parquet"

    def sweep(grammar):
        return run_sweep(
            load_dataset(str(log)),
            grid,
            out,
            model=tiny_model_path,
            executor=LocalExecutor(1),
            threads=1,
            progress=False,
            grammar=grammar,
        )

    sweep(words)
    df = read_results(out)
    by_id = dict(zip(df["question_id"], df["grammar"]))
    assert by_id["free"] == grammar_label(words)  # the sweep's grammar
    assert by_id["json"] not in ("", grammar_label(words))  # the request's own schema
    assert set(df["sweep_grammar"]) == {grammar_label(words)}
    with pytest.raises(ResumeError, match="sweep_grammar"):
        sweep(None)


def test_a_logged_requests_grammar_reaches_its_start():
    from specviz.analysis.request_runs import request_start_args

    req = parse_request({"messages": [{"role": "user", "content": "hi"}], "json_schema": SCHEMA}, "r")
    n, kwargs = request_start_args(req, max_tokens=16, sampling={"grammar": 'root ::= "x"'})
    assert kwargs["grammar"] == req.options["grammar"]  # the request's own, before run --requests' --grammar
    plain = parse_request({"messages": [{"role": "user", "content": "hi"}]}, "p")
    assert (
        request_start_args(plain, max_tokens=16, sampling={"grammar": 'root ::= "x"'})[1]["grammar"] == 'root ::= "x"'
    )
