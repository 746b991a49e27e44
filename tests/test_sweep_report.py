"""The sweep report's numbers, checked on a hand-made results file, and its offline HTML page."""

from __future__ import annotations

import json
import math
import re

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")
pytest.importorskip("plotly")

from specviz.cli import main as cli  # noqa: E402
from specviz.decoding.machine_load import JUDGED_SECONDS  # noqa: E402
from specviz.sweep.report import format_table, leaderboard, summarise, write_report  # noqa: E402


def _row(qid, cat, rep, strategy, tps, none_tps, gen, rounds, drafted, accepted):
    setting = "none" if strategy == "none" else "prompt-lookup draft_max=8"
    return {
        "question_id": qid,
        "category": cat,
        "repeat": rep,
        "setting": setting,
        "strategy": strategy,
        "setting_key": setting,
        "temperature": 0.0,
        "tokens_per_second": float(tps),
        "none_tokens_per_second": float(none_tps),
        "speedup": tps / none_tps,
        "n_generated": gen,
        "rounds": rounds,
        "drafted": drafted,
        "accepted": accepted,
        "model": "tiny.gguf",
        "prompt_format": "plain",
        "max_tokens": 100,
        "worker": "h:1",
        "tokens": [1, 2],
        "seconds": gen / tps,
    }


@pytest.fixture()
def results():
    """Two categories: a (p1 with two repeats, p2) and b (p3); none and one speculative setting."""
    rows = [
        _row("p1", "a", 0, "none", 10, 10, 100, 100, 0, 0),
        _row("p1", "a", 0, "prompt-lookup", 20, 10, 100, 40, 120, 60),
        _row("p1", "a", 1, "none", 12, 12, 100, 100, 0, 0),
        _row("p1", "a", 1, "prompt-lookup", 30, 12, 100, 50, 100, 50),
        _row("p2", "a", 0, "none", 20, 20, 50, 50, 0, 0),
        _row("p2", "a", 0, "prompt-lookup", 30, 20, 50, 25, 40, 25),
        _row("p3", "b", 0, "none", 40, 40, 80, 80, 0, 0),
        _row("p3", "b", 0, "prompt-lookup", 20, 40, 80, 80, 10, 0),
    ]
    return pd.DataFrame(rows)


def cell(summary, category, strategy):
    sub = summary[(summary["category"] == category) & (summary["strategy"] == strategy)]
    assert len(sub) == 1
    return sub.iloc[0]


def test_numbers_by_hand(results):
    s = summarise(results)
    # category a: per prompt, medians over repeats: p1 tps 25 (none 11), paired 2.25; p2 tps 30 (none 20), paired 1.5
    a = cell(s, "a", "prompt-lookup")
    assert a["prompts"] == 2 and a["runs"] == 3
    assert a["speedup"] == pytest.approx(27.5 / 15.5)  # mean tokens/s over prompts / none's (Spec-Bench)
    assert a["speedup_sd"] == pytest.approx(0.75 / math.sqrt(2))  # sd of the paired speedups 2.25 and 1.5
    assert (a["speedup_min"], a["speedup_max"]) == (1.5, 2.25)
    assert a["mean_accepted_tokens"] == pytest.approx(250 / 115)  # pooled tokens / rounds
    assert a["mean_accepted_tokens_sd"] == pytest.approx((200 / 90 - 2.0) / math.sqrt(2))
    assert a["acceptance"] == pytest.approx(135 / 260)  # pooled accepted / drafted
    assert a["acceptance_sd"] == pytest.approx(0.125 / math.sqrt(2))  # per prompt 0.5 and 0.625
    assert a["tokens_per_second"] == pytest.approx(27.5)
    b = cell(s, "b", "prompt-lookup")
    assert b["speedup"] == pytest.approx(0.5) and math.isnan(b["speedup_sd"])  # one prompt: no spread
    assert b["mean_accepted_tokens"] == 1.0 and b["acceptance"] == 0.0
    overall = cell(s, "overall", "prompt-lookup")
    assert overall["prompts"] == 3
    assert overall["speedup"] == pytest.approx(25 / (71 / 3))
    assert overall["mean_accepted_tokens"] == pytest.approx(330 / 195)
    assert overall["acceptance"] == pytest.approx(0.5)
    for cat in ("a", "b", "overall"):
        n = cell(s, cat, "none")
        assert n["speedup"] == 1.0 and n["mean_accepted_tokens"] == 1.0 and math.isnan(n["acceptance"])


def test_leaderboard_and_printed_table(results):
    s = summarise(results)
    lb = leaderboard(s)
    assert list(lb.columns) == ["a", "b", "overall", "mean accepted tokens", "acceptance"]
    assert list(lb.index) == ["none", "prompt-lookup draft_max=8"]
    assert lb.loc["prompt-lookup draft_max=8", "a"] == pytest.approx(27.5 / 15.5)
    text = format_table(s)
    assert re.search(r"prompt-lookup draft_max=8\s+1\.77x\s+0\.50x\s+1\.06x\s+1\.69\s+50\.0%", text), text
    assert re.search(
        r"a\s+prompt-lookup draft_max=8\s+2\s+1\.77x ± 0\.53x\s+2\.17 ± 0\.16\s+51\.9% ± 8\.8%\s+27\.5", text
    ), text
    assert re.search(r"b\s+prompt-lookup draft_max=8\s+1\s+0\.50x\s+1\.00\s+0\.0%\s+20\.0", text), text
    assert re.search(r"a\s+none\s+2\s+1\.00x ± 0\.00x\s+1\.00 ± 0\.00\s+—", text), text


def test_html_report_is_self_contained(results, tmp_path):
    out = write_report(results, tmp_path / "r.html", title="hand-made")
    page = out.read_text(encoding="utf-8")
    assert "<script src" not in page and not re.search(r"<link[^>]+href=\"?https?:", page)
    assert "cdn.plot.ly/plotly" not in page.split("</script>", 1)[1]  # no figure asks for the CDN bundle
    assert page.count("Plotly.newPlot") == 5  # five figures, drawn by the inlined plotly.js
    import plotly

    assert len(page) > 1_000_000 and "plotly.js v" in page, plotly.__version__
    data = json.loads(re.search(r'id="specviz-summary">(.*?)</script>', page, re.S).group(1).replace("&quot;", '"'))
    a = next(r for r in data if r["category"] == "a" and r["strategy"] == "prompt-lookup")
    assert a["speedup"] == pytest.approx(27.5 / 15.5)
    assert "1.77× ± 0.53×" in page and "51.9% ± 8.8%" in page


def test_report_command_prints_the_table_and_writes_the_page(results, tmp_path, capsys):
    src = tmp_path / "results.parquet"
    results.to_parquet(src)
    assert cli.main(["report", str(src)]) == 0
    out = capsys.readouterr()
    assert "1.77x ± 0.53x" in out.out
    assert (tmp_path / "results.html").is_file() and "wrote" in out.err
    assert cli.main(["report", str(src), "-o", str(tmp_path / "other.html"), "--title", "T"]) == 0
    assert "<title>T</title>" in (tmp_path / "other.html").read_text(encoding="utf-8")


def _with_shares(results, shares):
    """The results with a ``cpu_share`` per row (and two llama.cpp threads each)."""
    return results.assign(cpu_share=shares, n_threads=2)


def test_cpu_share_is_pooled_per_cell_and_shown(results):
    quiet = _with_shares(results, [0.9, 1.0, 0.9, 1.0, 0.8, 0.95, 1.0, 1.05])
    s = summarise(quiet)
    a = cell(s, "a", "prompt-lookup")  # p1 runs of 5 s (share 1.0) and 100/30 s (1.0), p2 50/30 s (0.95)
    w = [5.0, 100 / 30, 50 / 30]
    assert a["cpu_share"] == pytest.approx((1.0 * w[0] + 1.0 * w[1] + 0.95 * w[2]) / sum(w))
    assert a["cpu_share_min"] == 0.95 and a["busy_runs"] == 0
    text = format_table(s)
    assert "CPU share" in text and "warning" not in text and "busy" not in text
    assert re.search(r"b\s+none\s+1\s+1\.00x\s+1\.00\s+—\s+40\.0\s+100%", text), text


def test_report_warns_of_runs_timed_on_a_busy_machine(results, tmp_path, capsys):
    busy = _with_shares(results, [0.9, 1.0, 0.9, 0.35, 0.8, 0.95, 1.0, 0.55])
    s = summarise(busy)
    assert cell(s, "b", "prompt-lookup")["busy_runs"] == 1 and cell(s, "overall", "prompt-lookup")["busy_runs"] == 2
    text = format_table(s)
    warning = "warning: 2 of 8 runs had a CPU share below 60% (the lowest 35%): their timings were taken on a busy"
    assert text.startswith(warning), text
    page = write_report(busy, tmp_path / "r.html").read_text(encoding="utf-8")
    assert 'class="warning"' in page and "2 of 8 runs" in page and "taken on a busy machine" in page
    src = tmp_path / "busy.parquet"
    busy.to_parquet(src)
    assert cli.main(["report", str(src)]) == 0
    assert warning in capsys.readouterr().out


def test_no_warning_from_a_quiet_sweep_or_a_file_without_shares(results, tmp_path):
    quiet = _with_shares(results, [0.9, 1.0, 0.9, 1.0, 0.8, 0.95, 1.0, 1.05])
    for df in (quiet, results, _with_shares(results, [float("nan")] * 8)):
        s = summarise(df)
        assert s["busy_runs"].sum() == 0 and "warning" not in format_table(s)
        page = write_report(df, tmp_path / "r.html").read_text(encoding="utf-8")
        assert 'class="warning"' not in page
    assert summarise(results)["cpu_share"].isna().all()  # no column: not known, shown as —


@pytest.mark.browser
def test_html_report_draws_its_charts_offline_in_chromium(results, tmp_path):
    import importlib.util

    from browser_util import ROOT, need_browser

    need_browser()
    spec = importlib.util.spec_from_file_location("shot", ROOT / "examples" / "sweep_report_screenshot.py")
    shot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shot)
    page = write_report(results, tmp_path / "r.html")
    refused = shot.screenshot(page, tmp_path / "r.png")  # waits until all five charts have drawn
    assert refused == [] and (tmp_path / "r.png").stat().st_size > 10_000


def test_a_run_too_short_to_judge_is_not_called_busy(results):
    # the same busy shares, but the runs last 0.1 s: fewer scheduler ticks than a share can be judged over
    short = _with_shares(results, [0.9, 1.0, 0.9, 0.35, 0.8, 0.95, 1.0, 0.55]).assign(seconds=0.1)
    assert summarise(short)["busy_runs"].sum() == 0 and "warning" not in format_table(summarise(short))
    long = short.assign(seconds=JUDGED_SECONDS)
    assert cell(summarise(long), "overall", "prompt-lookup")["busy_runs"] == 2
