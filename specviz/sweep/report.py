"""The sweep report: per category and setting, speedup over ``none``, mean accepted tokens, acceptance.

The figures follow Spec-Bench's leaderboard:

* **speedup**: the mean over a category's prompts of each prompt's decode tokens/s, over the same mean
  for the ``none`` runs paired with them (each prompt's tokens/s is first the median over repeats);
* **mean accepted tokens**: tokens per target verify batch, all rounds of the category pooled (1.00 for
  ``none``: one token per forward pass);
* **acceptance**: accepted over drafted draft tokens, pooled the same way.

The spread over prompts (``±``, one standard deviation) is that of the per-prompt figures: for the
speedup, each prompt's *paired* speedup — its runs over the ``none`` run just before them on the same
worker — so machine drift between prompts does not show up as spread. The ``overall`` category pools
every prompt.

Each cell's **CPU share** is its runs' ``cpu_share`` pooled (weighted by decode seconds × threads), and a
run of at least :data:`~specviz.decoding.machine_load.JUDGED_SECONDS` whose share
:func:`~specviz.decoding.machine_load.is_busy` says had a busy machine is counted: the
printed table and the page warn when any run did, since its timings (and the speedups from them) are not
the machine's own.

:func:`write_report` writes all of it as one self-contained HTML page: plotly.js is inlined from the
``plotly`` package, nothing is loaded from the network.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from pathlib import Path
from typing import Any

from ..decoding.machine_load import BUSY_SHARE, is_busy, judged_share

#: The name of the row pooling every category.
OVERALL = "overall"


def _setting_order(df) -> list[str]:
    """Settings by temperature, ``none`` first at each, then in the order they first appear."""
    first: dict[str, tuple[float, bool, int]] = {}
    for i, (label, strategy, temp) in enumerate(zip(df["setting"], df["strategy"], df["temperature"])):
        first.setdefault(label, (float(temp), strategy != "none", i))
    return sorted(first, key=lambda k: first[k])


def _with_load(df):
    """``df`` with the columns the CPU share is pooled by: ``cpu_weight`` (decode seconds × threads, 0 where
    the share is not known, as in files from before the column), ``cpu_weighted`` (share × weight) and
    ``busy`` (the run's share is busy, judged only over a run of at least
    :data:`~specviz.decoding.machine_load.JUDGED_SECONDS`)."""
    import pandas as pd

    share = df["cpu_share"].astype(float) if "cpu_share" in df else pd.Series(float("nan"), index=df.index)
    threads = df["n_threads"].astype(float) if "n_threads" in df else 1.0
    # a file without seconds: each run weighs the same and counts as long enough to judge
    seconds = df["seconds"].astype(float) if "seconds" in df else pd.Series(1.0, index=df.index)
    weight = (share.notna() * seconds * threads).fillna(0.0)
    return df.assign(
        cpu_share=share,
        cpu_weight=weight,
        cpu_weighted=(share * weight).fillna(0.0),
        busy=[is_busy(judged_share(None if math.isnan(x) else x, t)) for x, t in zip(share, seconds)],
    )


def per_prompt(df):
    """One row per (category, prompt, setting): medians over repeats and the pooled counters."""
    df = _with_load(df)
    g = df.groupby(["category", "question_id", "setting", "strategy", "temperature"], sort=False)
    out = g.agg(
        tokens_per_second=("tokens_per_second", "median"),
        none_tokens_per_second=("none_tokens_per_second", "median"),
        speedup=("speedup", "median"),
        n_generated=("n_generated", "sum"),
        rounds=("rounds", "sum"),
        drafted=("drafted", "sum"),
        accepted=("accepted", "sum"),
        repeats=("repeat", "nunique"),
        cpu_weight=("cpu_weight", "sum"),
        cpu_weighted=("cpu_weighted", "sum"),
        cpu_share_min=("cpu_share", "min"),
        busy_runs=("busy", "sum"),
    ).reset_index()
    out["mean_accepted_tokens"] = out["n_generated"] / out["rounds"].where(out["rounds"] > 0)
    out["acceptance_rate"] = out["accepted"] / out["drafted"].where(out["drafted"] > 0)
    return out


def _cell(pp) -> dict[str, Any]:
    none_mean = pp["none_tokens_per_second"].mean()
    drafted = pp["drafted"].sum()
    return {
        "prompts": len(pp),
        "runs": int(pp["repeats"].sum()),
        "speedup": pp["tokens_per_second"].mean() / none_mean if none_mean > 0 else float("nan"),
        "speedup_sd": pp["speedup"].std(ddof=1) if len(pp) > 1 else float("nan"),
        "speedup_min": pp["speedup"].min(),
        "speedup_max": pp["speedup"].max(),
        "mean_accepted_tokens": pp["n_generated"].sum() / pp["rounds"].sum() if pp["rounds"].sum() else float("nan"),
        "mean_accepted_tokens_sd": pp["mean_accepted_tokens"].std(ddof=1) if len(pp) > 1 else float("nan"),
        "acceptance": pp["accepted"].sum() / drafted if drafted else float("nan"),
        "acceptance_sd": pp["acceptance_rate"].dropna().std(ddof=1)
        if pp["acceptance_rate"].notna().sum() > 1
        else float("nan"),
        "tokens_per_second": pp["tokens_per_second"].mean(),
        "cpu_share": pp["cpu_weighted"].sum() / pp["cpu_weight"].sum() if pp["cpu_weight"].sum() > 0 else float("nan"),
        "cpu_share_min": pp["cpu_share_min"].min(),
        "busy_runs": int(pp["busy_runs"].sum()),
    }


def summarise(df):
    """The table: one row per (category, setting), plus ``overall`` rows pooling every category."""
    import pandas as pd

    pp = per_prompt(df)
    order = _setting_order(df)
    cats = list(dict.fromkeys(df["category"]))
    rows = []
    for cat in cats + [OVERALL]:
        part = pp if cat == OVERALL else pp[pp["category"] == cat]
        for setting in order:
            sub = part[part["setting"] == setting]
            if len(sub):
                rows.append(
                    {
                        "category": cat,
                        "setting": setting,
                        "strategy": sub["strategy"].iloc[0],
                        "temperature": float(sub["temperature"].iloc[0]),
                        **_cell(sub),
                    }
                )
    return pd.DataFrame(rows)


def leaderboard(summary):
    """Spec-Bench's leaderboard shape: a row per setting, the speedup per category, then overall figures."""
    wide = summary.pivot(index="setting", columns="category", values="speedup")
    cats = [c for c in dict.fromkeys(summary["category"]) if c != OVERALL]
    overall = summary[summary["category"] == OVERALL].set_index("setting")
    wide = wide.reindex(index=list(dict.fromkeys(summary["setting"])), columns=cats + [OVERALL])
    wide["mean accepted tokens"] = overall["mean_accepted_tokens"]
    wide["acceptance"] = overall["acceptance"]
    return wide


def _detail(summary):
    """The rows to list one by one: the ``overall`` rows only when they pool more than one category."""
    if summary["category"].nunique() <= 2:
        return summary[summary["category"] != OVERALL]
    return summary


def _nan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _pm(value: float, sd: float, fmt: str, suffix: str = "") -> str:
    if _nan(value):
        return "—"
    text = format(value, fmt) + suffix
    if not _nan(sd):
        text += " ± " + format(sd, fmt) + suffix
    return text


def _pct(value: float, sd: float) -> str:
    if _nan(value):
        return "—"
    return f"{value:.1%}" + ("" if _nan(sd) else f" ± {sd:.1%}")


def load_warning(summary) -> str | None:
    """The warning that some runs were timed on a busy machine (their CPU share
    :func:`~specviz.decoding.machine_load.is_busy`), naming how many; None when none was."""
    cells = summary[summary["category"] != OVERALL]
    busy = int(cells["busy_runs"].sum()) if "busy_runs" in cells else 0
    if not busy:
        return None
    return (
        f"warning: {busy} of {int(cells['runs'].sum())} runs had a CPU share below {BUSY_SHARE:.0%} "
        f"(the lowest {cells['cpu_share_min'].min():.0%}): their timings were taken on a busy machine, and the "
        "speedups from them are not this machine's; run them again on a quiet machine"
    )


def _share(value: float) -> str:
    return "—" if _nan(value) else f"{value:.0%}"


def format_table(summary) -> str:
    """The summary as plain-text tables: the leaderboard, then every (category, setting) with its spread and
    CPU share; the load warning (:func:`load_warning`) first where there is one."""
    lb = leaderboard(summary)
    cols = list(lb.columns)
    w0 = max([len("setting")] + [len(s) for s in lb.index])
    widths = [max(len(c), 8) for c in cols]
    warning = load_warning(summary)
    lines = [warning, ""] if warning else []
    lines.append("speedup over none per category (mean tokens/s over prompts / none's), with overall figures")
    lines.append("  ".join([f"{'setting':<{w0}}"] + [f"{c:>{w}}" for c, w in zip(cols, widths)]))
    for setting, row in lb.iterrows():
        cells = []
        for c, w in zip(cols, widths):
            v = row[c]
            if _nan(v):
                cells.append(f"{'—':>{w}}")
            elif c == "acceptance":
                cells.append(f"{'—' if setting.startswith('none') else f'{v:.1%}':>{w}}")
            elif c == "mean accepted tokens":
                cells.append(f"{v:>{w}.2f}")
            else:
                cells.append(f"{f'{v:.2f}x':>{w}}")
        lines.append("  ".join([f"{setting:<{w0}}"] + cells))
    lines.append("")
    lines.append(
        "per category and setting; ± is one standard deviation over prompts (speedup: each prompt's "
        "runs over its paired none run)"
    )
    header = [
        "category",
        "setting",
        "prompts",
        "speedup",
        "mean accepted tokens",
        "acceptance",
        "tokens/s",
        "CPU share",
    ]
    body = []
    for r in _detail(summary).itertuples():
        none = r.strategy == "none"
        body.append(
            [
                r.category,
                r.setting,
                str(r.prompts),
                _pm(r.speedup, r.speedup_sd, ".2f", "x"),
                _pm(r.mean_accepted_tokens, r.mean_accepted_tokens_sd, ".2f"),
                "—" if none else _pct(r.acceptance, r.acceptance_sd),
                f"{r.tokens_per_second:.1f}",
                _share(r.cpu_share),
            ]
        )
    widths2 = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    right = {2, 3, 4, 5, 6, 7}

    def fmt_row(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths2)))

    lines.append(fmt_row(header))
    lines.extend(fmt_row(b) for b in body)
    return "\n".join(lines)


def figures(df) -> dict[str, Any]:
    """The report's plotly figures by title: speedup, per-prompt speedups, mean accepted tokens, acceptance."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    summary = summarise(df)
    pp = per_prompt(df)
    order = list(dict.fromkeys(summary["setting"]))
    spec = [s for s in order if not summary[summary["setting"] == s]["strategy"].eq("none").all()]
    palette = qualitative.Plotly + qualitative.D3 + qualitative.Dark24
    color = {s: palette[i % len(palette)] for i, s in enumerate(order)}  # one colour per setting in every chart
    bars = _CategoryBars(go, summary, color)
    figs: dict[str, Any] = {}
    fig = bars.chart(
        "speedup",
        "speedup_sd",
        "Speedup over none by category (± one sd over prompts)",
        "speedup over none",
        order,
        ".2f",
    )
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    figs["speedup"] = fig
    figs["per-prompt speedup"] = _per_prompt_speedups(go, pp, spec, color)
    figs["mean accepted tokens"] = bars.chart(
        "mean_accepted_tokens",
        "mean_accepted_tokens_sd",
        "Mean accepted tokens per verify batch (± one sd over prompts)",
        "tokens per round",
        order,
        ".2f",
    )
    fig = bars.chart(
        "acceptance", "acceptance_sd", "Acceptance of drafted tokens (± one sd over prompts)", "acceptance", spec, ".1%"
    )
    fig.update_yaxes(tickformat=".0%")
    figs["acceptance"] = fig
    figs["acceptance vs speedup"] = _acceptance_and_speedup(go, pp, spec, color)
    return figs


class _CategoryBars:
    """Grouped bar charts of one summary column per category (and overall), one bar colour per setting."""

    def __init__(self, go: Any, summary: Any, color: dict[str, str]) -> None:
        self.go, self.summary, self.color = go, summary, color
        self.cats = [c for c in dict.fromkeys(summary["category"]) if c != OVERALL] + [OVERALL]

    def chart(self, value: str, sd: str, title: str, axis: str, settings: list[str], fmt: str) -> Any:
        """Column ``value`` with ``sd`` as the error bar, for each of ``settings``."""
        fig = self.go.Figure()
        for s in settings:
            sub = self.summary[self.summary["setting"] == s].set_index("category").reindex(self.cats)
            fig.add_bar(
                name=s,
                x=self.cats,
                y=sub[value],
                marker_color=self.color[s],
                error_y={"type": "data", "array": sub[sd].fillna(0), "visible": True},
                hovertemplate=f"%{{x}}<br>{s}<br>{axis} %{{y:{fmt}}}<extra></extra>",
            )
        fig.update_layout(
            title=title, barmode="group", yaxis_title=axis, legend_title="setting", template="plotly_white", height=420
        )
        return fig


def _per_prompt_speedups(go: Any, pp: Any, spec: list[str], color: dict[str, str]) -> Any:
    """A box of each speculative setting's per-prompt paired speedups, every prompt shown as a point."""
    fig = go.Figure()
    for s in spec:
        sub = pp[pp["setting"] == s]
        fig.add_box(
            name=s,
            y=sub["speedup"],
            marker_color=color[s],
            boxpoints="all",
            jitter=0.4,
            pointpos=0,
            text=sub["category"] + " / " + sub["question_id"].astype(str),
            hovertemplate="%{text}<br>paired speedup %{y:.2f}<extra></extra>",
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(
        title="Paired speedup of each prompt (its runs over the none run just before them)",
        yaxis_title="paired speedup",
        showlegend=False,
        template="plotly_white",
        height=420,
    )
    return fig


def _acceptance_and_speedup(go: Any, pp: Any, spec: list[str], color: dict[str, str]) -> Any:
    """Acceptance against paired speedup, one point per prompt and speculative setting."""
    fig = go.Figure()
    for s in spec:
        sub = pp[pp["setting"] == s]
        fig.add_scatter(
            name=s,
            x=sub["acceptance_rate"],
            y=sub["speedup"],
            mode="markers",
            marker_color=color[s],
            text=sub["category"] + " / " + sub["question_id"].astype(str),
            hovertemplate="%{text}<br>acceptance %{x:.1%}<br>speedup %{y:.2f}<extra></extra>",
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(
        title="Acceptance and paired speedup, one point per prompt",
        xaxis_title="acceptance",
        yaxis_title="paired speedup",
        xaxis_tickformat=".0%",
        template="plotly_white",
        height=420,
    )
    return fig


def _html_table(frame, formats: dict[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for _, row in frame.iterrows():
        cells = []
        for c in frame.columns:
            f = formats.get(c)
            cells.append(f"<td>{html.escape(f(row) if f else str(row[c]))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1200px;
       color: #1d2330; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { font-size: 1.15em; margin-top: 28px; }
.meta { color: #5b6475; font-size: 0.9em; margin-bottom: 12px; }
table { border-collapse: collapse; font-size: 0.88em; margin: 8px 0 16px; }
th, td { border-bottom: 1px solid #e1e4ea; padding: 4px 10px; text-align: right; white-space: nowrap; }
th:first-child, td:first-child, th:nth-child(2), td:nth-child(2) { text-align: left; }
thead th { background: #f3f5f8; }
.note { color: #5b6475; font-size: 0.85em; max-width: 900px; }
.warning { color: #8a4b00; background: #fff4e0; padding: 8px 12px; max-width: 900px; }
"""


def write_report(df, path: str | Path, *, title: str = "specviz sweep") -> Path:
    """Write the self-contained HTML report of the results ``df`` to ``path`` and return the path."""
    from plotly.offline import get_plotlyjs

    summary = summarise(df)
    meta = _run_facts(df)
    parts = [
        fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            config={"displaylogo": False, "responsive": True},
            div_id=f"fig-{i}",
        )
        for i, fig in enumerate(figures(df).values())
    ]
    warning = load_warning(summary)
    warning_html = f'<p class="warning">{html.escape(warning)}</p>' if warning else ""
    embedded = html.escape(json.dumps(summary.to_dict(orient="records"), default=float))
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<h1>{html.escape(title)}</h1>
<div class="meta">{" · ".join(f"{html.escape(k)}: {html.escape(v)}" for k, v in meta.items())}
 · written {_dt.datetime.now().strftime("%Y-%m-%d %H:%M")}</div>
{warning_html}
<h2>Speedup over none by category</h2>
{_leaderboard_html(summary)}
<p class="note">As Spec-Bench's leaderboard: the mean decode tokens/s over a category's prompts over the same mean
for the none runs paired with them; mean accepted tokens = tokens per target verify batch (pooled); acceptance =
accepted / drafted tokens (pooled).</p>
<h2>Per category and setting, with the spread over prompts</h2>
{_detail_html(summary)}
<p class="note">± is one standard deviation over prompts. The speedup's spread and range are those of each
prompt's paired speedup: its runs over the none run taken just before them on the same worker. The CPU share is
the cell's runs' CPU seconds over their decode seconds times threads: below {BUSY_SHARE:.0%} the machine was
busy.</p>
{"".join(f'<div class="fig">{p}</div>' for p in parts)}
<script type="application/json" id="specviz-summary">{embedded}</script>
</body></html>
"""
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return out


def _run_facts(df) -> dict[str, str]:
    """The page's header line: model, prompt format, tokens per turn, prompts, runs, workers."""
    return {
        "model": ", ".join(sorted(map(str, df["model"].unique()))) if "model" in df else "?",
        "prompt format": ", ".join(sorted(map(str, df["prompt_format"].unique()))) if "prompt_format" in df else "?",
        "max tokens per turn": ", ".join(sorted(map(str, df["max_tokens"].unique()))) if "max_tokens" in df else "?",
        "prompts": str(df["question_id"].nunique()),
        "runs": str(len(df)),
        "workers": str(df["worker"].nunique()) if "worker" in df else "?",
    }


def _leaderboard_html(summary) -> str:
    """The leaderboard (speedup per category, mean accepted tokens, acceptance) as an HTML table."""
    lb = leaderboard(summary).reset_index()
    cats = [c for c in lb.columns if c not in ("setting", "mean accepted tokens", "acceptance")]
    lb_fmt: dict[str, Any] = {c: (lambda r, c=c: "—" if _nan(r[c]) else f"{r[c]:.2f}×") for c in cats}
    lb_fmt["mean accepted tokens"] = lambda r: f"{r['mean accepted tokens']:.2f}"
    lb_fmt["acceptance"] = lambda r: (
        "—" if r["setting"].startswith("none") or _nan(r["acceptance"]) else f"{r['acceptance']:.1%}"
    )
    return _html_table(lb, lb_fmt)


def _detail_html(summary) -> str:
    """Every category and setting with the spread over prompts (± one sd, the paired speedups' range)."""
    detail = _detail(summary)[
        [
            "category",
            "setting",
            "prompts",
            "speedup",
            "speedup_min",
            "mean_accepted_tokens",
            "acceptance",
            "tokens_per_second",
            "cpu_share",
        ]
    ].rename(
        columns={
            "speedup_min": "paired speedup min–max",
            "mean_accepted_tokens": "mean accepted tokens",
            "tokens_per_second": "tokens/s",
            "cpu_share": "CPU share",
        }
    )
    by_key = {(r.category, r.setting): r for r in summary.itertuples()}
    d_fmt = {
        "speedup": lambda r: _pm(r["speedup"], by_key[(r["category"], r["setting"])].speedup_sd, ".2f", "×"),
        "paired speedup min–max": lambda r: (
            f"{by_key[(r['category'], r['setting'])].speedup_min:.2f}–"
            f"{by_key[(r['category'], r['setting'])].speedup_max:.2f}"
        ),
        "mean accepted tokens": lambda r: _pm(
            r["mean accepted tokens"], by_key[(r["category"], r["setting"])].mean_accepted_tokens_sd, ".2f"
        ),
        "acceptance": lambda r: (
            "—"
            if by_key[(r["category"], r["setting"])].strategy == "none"
            else _pct(r["acceptance"], by_key[(r["category"], r["setting"])].acceptance_sd)
        ),
        "tokens/s": lambda r: f"{r['tokens/s']:.1f}",
        "CPU share": lambda r: _share(r["CPU share"]),
    }
    return _html_table(detail, d_fmt)
