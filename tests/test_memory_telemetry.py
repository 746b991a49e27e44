"""Memory telemetry: per-context bytes, saved states, the process's memory, thermal and clock figures, and
where they appear (session telemetry, ``specviz run --json``, bench rows, sweep rows)."""

from __future__ import annotations

import json
import re

import pytest
from test_cli import run_cli

from specviz import Session
from specviz.analysis.bench import BenchSetting, format_memory, run_bench
from specviz.decoding.machine import NOT_AVAILABLE, MachineSampler, process_memory
from specviz.testing.memory_models import write_tiny_gemma3_swa, write_tiny_mamba

PROMPT = "the cat sat on the mat and the cat sat on the mat and the"


@pytest.fixture(scope="module")
def mamba_path(tmp_path_factory):
    return write_tiny_mamba(tmp_path_factory.mktemp("mem_tel") / "mamba.gguf", block_scale=0.02)


@pytest.fixture(scope="module")
def gemma3_path(tmp_path_factory):
    return write_tiny_gemma3_swa(tmp_path_factory.mktemp("mem_tel") / "gemma3.gguf", sliding_window=16)


def test_thermal_and_clock_figures_where_the_machine_exposes_them(tmp_path):
    for i, milli in enumerate((45000, 52500)):
        zone = tmp_path / f"thermal_zone{i}"
        zone.mkdir()
        (zone / "temp").write_text(f"{milli}\n")
    for i, khz in enumerate((2400000, 1800000)):
        cpu = tmp_path / f"cpu{i}" / "cpufreq"
        cpu.mkdir(parents=True)
        (cpu / "scaling_cur_freq").write_text(f"{khz}\n")
    m = MachineSampler(str(tmp_path / "thermal_zone*/temp"), str(tmp_path / "cpu[0-9]*/cpufreq/scaling_cur_freq"))
    (tmp_path / "thermal_zone0" / "temp").write_text("61000\n")
    m.sample(force=True)
    f = m.figures()
    # the hottest zone per sample (52.5 °C, then 61 °C); the mean clock over the CPUs (2100 MHz twice)
    assert f["thermal_c"] == {"available": True, "min": 52.5, "mean": 56.75, "max": 61.0, "samples": 2}
    assert f["cpu_mhz"] == {"available": True, "min": 2100.0, "mean": 2100.0, "max": 2100.0, "samples": 2}
    m.sample()  # younger than MachineSampler.every: not taken
    assert m.figures()["cpu_mhz"]["samples"] == 2


def test_figures_the_machine_does_not_expose_say_so_and_carry_no_number(tmp_path):
    m = MachineSampler(str(tmp_path / "none*/temp"), str(tmp_path / "none*/freq"))
    f = m.figures()
    for key in ("thermal_c", "cpu_mhz"):
        assert f[key]["available"] is False and f[key]["value"] == NOT_AVAILABLE
        assert str(tmp_path) in f[key]["why"]
        assert not {"min", "mean", "max"} & set(f[key])


def test_process_memory_is_read_from_the_process():
    m = process_memory()
    assert m["rss_bytes"] is not None and m["rss_bytes"] > 10 << 20  # python, numpy and llama.cpp at least
    assert m["peak_rss_bytes"] >= m["rss_bytes"]


def test_session_telemetry_carries_memory_and_checkpoint_figures(mamba_path):
    s = Session(mamba_path, n_ctx=256, n_threads=1)
    s.start(PROMPT, max_tokens=30, strategy="none")
    s.run()
    none = s.telemetry_dict()
    s.start(PROMPT, max_tokens=30, strategy="prompt-lookup", draft_max=4)
    s.run()
    spec = s.telemetry_dict()
    for t in (none, spec):
        tgt = t["memory"]["target"]
        assert tgt["kind"] == "recurrent" and tgt["kv_bytes"] == 0 and tgt["recurrent_bytes"] > 0
        assert tgt["weight_bytes"] > 0 and t["memory"]["draft"] is None
        assert t["memory"]["rss_bytes"] > 0 and "thermal_c" in t["machine"]
        json.dumps(t)
    # none keeps only the state after the prompt; prompt-lookup checkpoints before every verify with a draft
    assert none["checkpoints"] == 1 and none["rollback_paths"] == {}
    assert spec["checkpoints"] > 1 and spec["rollback_paths"].get("checkpoint", 0) > 0
    assert spec["checkpoint_bytes"] == spec["checkpoints"] * spec["memory"]["target"]["state_bytes"]
    assert spec["memory"]["target"]["marks"] >= 1
    # the Telemetry events carry the same section
    last = [e for e in s.events if e.kind == "telemetry"][-1]
    assert last.data["memory"]["target"]["kind"] == "recurrent"
    s.close()


@pytest.mark.slow
def test_run_json_has_memory_and_the_ring_and_snapshot_options(tiny_model_path, gemma3_path):
    r = run_cli("run", "--model", str(gemma3_path), "--prompt", PROMPT, "--max-tokens", "6", "--swa-ring", "--json")
    assert r.returncode == 0, r.stderr
    mem = json.loads(r.stdout)["telemetry"]["memory"]["target"]
    assert mem["kind"] == "ring" and mem["swa_cells"] < mem["cells"]
    r = run_cli("run", "--model", str(tiny_model_path), "--prompt", "a", "--max-tokens", "4")
    assert r.returncode == 0 and "memory attention; KV" in r.stderr and "process resident" in r.stderr
    r = run_cli("run", "--model", str(tiny_model_path), "--prompt", "a", "--n-rs-seq", "-1")
    assert r.returncode == 2 and "--n-rs-seq" in r.stderr
    r = run_cli("info", str(gemma3_path), "--swa-ring", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["memory"]["kind"] == "ring"


def test_bench_rows_carry_memory_beside_none(mamba_path):
    s = Session(mamba_path, n_ctx=2048, n_threads=1)
    rows = run_bench(
        s,
        kinds=["quote"],
        repeats=1,
        max_tokens=8,
        settings=[BenchSetting("prompt-lookup", "prompt-lookup", {"draft_max": 4})],
    )
    s.close()
    none, pl = rows
    assert none.strategy == "none" and pl.strategy == "prompt-lookup"
    assert none.memory["memory_bytes"] == pl.memory["memory_bytes"] > 0  # the same model and caches
    assert pl.memory["checkpoints"] >= none.memory["checkpoints"] >= 1
    table = format_memory(rows).splitlines()
    assert table[0].startswith("| workload | strategy | weights + caches |")
    assert table[2].startswith("| quote | none |") and table[3].startswith("| quote | prompt-lookup |")
    assert pl.to_dict()["memory"] == pl.memory


@pytest.mark.slow
def test_sweep_rows_carry_memory_columns(mamba_path, tmp_path):
    pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from specviz.sweep import GridSpec, LocalExecutor, build_grid, load_dataset, read_results, run_sweep

    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": [PROMPT]}) + "\n")
    grid = build_grid(GridSpec(strategies=["prompt-lookup"], knobs={"draft_max": [4]}, temperatures=[0], max_tokens=12))
    out = tmp_path / "r.parquet"
    run_sweep(load_dataset(q), grid, out, model=str(mamba_path), executor=LocalExecutor(1), threads=1, progress=False)
    df = read_results(out)
    assert set(df["memory_kind"]) == {"recurrent"}
    assert (df["kv_bytes"] == 0).all() and (df["recurrent_bytes"] > 0).all() and (df["peak_rss_bytes"] > 0).all()
    none = df[df["strategy"] == "none"].iloc[0]
    pl = df[df["strategy"] == "prompt-lookup"].iloc[0]
    assert none["weight_bytes"] == pl["weight_bytes"] and none["draft_memory_bytes"] == 0
    assert pl["checkpoints"] >= none["checkpoints"] >= 1


@pytest.mark.slow
def test_info_says_how_each_memory_rolls_back_and_when_it_cannot(mamba_path, monkeypatch, capsys):
    import dataclasses

    import specviz.analysis.model_info as mi
    from specviz.cli.main import main

    r = run_cli("info", str(mamba_path))
    assert r.returncode == 0, r.stderr
    assert re.search(r"^memory\s+recurrent: no tail can be removed: every draft is verified after a", r.stdout, re.M)
    assert re.search(r"^  prompt-lookup\s+yes$", r.stdout, re.M)
    # a memory llama.cpp can neither cut nor save a partial state of (no tiny model has one: the probe's
    # answer is replaced, the verdicts and the text are the point): every drafting strategy says why
    real = mi._memory
    monkeypatch.setattr(mi, "_memory", lambda *a: dataclasses.replace(real(*a), removal="no"))
    assert main(["info", str(mamba_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^memory\s+recurrent: nothing can be rolled back: only 'none' runs", out, re.M)
    assert re.search(r"^  none\s+yes$", out, re.M)
    for name in ("prompt-lookup", "ngram-cache", "draft"):
        assert re.search(rf"^  {name}\s+no: the target's memory \(recurrent\) cannot drop a rejected draft", out, re.M)
    info = mi.model_info(mamba_path)
    assert {f.strategy for f in info.strategies if f.ok} == {"none"}


def test_resident_memory_is_read_at_most_once_a_window_and_afresh_after_a_fork(monkeypatch):
    """The round's resident figure is the last read, at most ``every`` seconds old: reading /proc after
    every decode cost a third of a greedy round's bookkeeping (docs/performance.md)."""
    from specviz.decoding import machine

    st = machine._Statm()
    reads = []
    monkeypatch.setattr(st, "_read", lambda: reads.append(1) or 4096 * len(reads))
    clock = [100.0]
    monkeypatch.setattr(machine.time, "monotonic", lambda: clock[0])
    assert st.resident() == 4096 and st.resident() == 4096 and len(reads) == 1
    clock[0] += st.every * 0.9
    assert st.resident() == 4096 and len(reads) == 1
    clock[0] += st.every * 0.2
    assert st.resident() == 8192 and len(reads) == 2
    st.forget()  # what a forked child does first
    assert st.resident() == 3 * 4096 and len(reads) == 3
    with open("/proc/self/statm") as f:
        rss_now = int(f.read().split()[1]) * machine.os.sysconf("SC_PAGE_SIZE")
    assert abs(machine._Statm()._read() - rss_now) < 64 << 20  # the read is this process's resident size


def test_a_forked_child_reads_its_own_resident_memory():
    """The figure read in the parent is the parent's: a forked child must read afresh (register_at_fork)."""
    import os

    from specviz.decoding import machine

    machine.process_memory()
    assert machine._statm.at >= 0  # the parent holds a recent figure
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its first read will be fresh
        os._exit(0 if machine._statm.at < 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
