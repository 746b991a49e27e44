// The advice panel: the draft settings with the best expected tokens/s on this machine (computed in
// Python: specviz.advise), the expected speedup with its uncertainty (a bootstrap interval over the
// recorded rounds), why speculation was or was not advised, what the advisor found about the machine load
// the timings were taken under, and the same setting as llama-server flags.

import { parallelSpec } from "../chart_specs.js";
import { h } from "../dom.js";
import { adviseMessage } from "../messages.js";

/** A setting's speedup interval ("1.20–1.36×"), or "" where none was estimated. */
function adviceInterval(c) {
  return c.speedup_low != null && c.speedup_high != null ? c.speedup_low.toFixed(2) + "–" + c.speedup_high.toFixed(2) + "×" : "";
}

/**
 * What the panel says about the load the advice's timings were taken under, or null (no load check, no
 * rounds). Every word is Python's (specviz.analysis.advise_load, Advice.both_figures): `headline` the verdict
 * and the CPU share, `detail` the report's load line, `notes` what the advisor did about it, `figures` the
 * speedup on this machine now beside the one on the recorded times. `attention`: the check found outside
 * load, the advice was scored with a fresh curve, or the advisor noted something about the load; else the
 * panel shows the headline as one muted line.
 */
export function adviceLoad(a) {
  const ld = a && a.load;
  if (!ld || !ld.rounds) return null;
  const notes = ld.notes || [];
  const figures = (a.both_figures || []).map((f) => ({ label: f.label, text: f.speedup.toFixed(2) + "×" }));
  const attention = ld.verdict !== "quiet" || !!ld.scored_fresh || figures.length > 0 || notes.length > 0;
  return { verdict: ld.verdict, attention, headline: ld.headline || "", detail: ld.text || "", notes, figures };
}

/** The load section of the panel (see adviceLoad), or null. */
function adviceLoadSection(a) {
  const ld = adviceLoad(a);
  if (!ld) return null;
  if (!ld.attention) return h("div", { class: "sv-muted sv-advice-load", title: ld.detail, text: ld.headline });
  const figures = ld.figures.length
    ? h("div", { class: "sv-advice-figures" }, ...ld.figures.map((f) => h("span", { class: "sv-advice-figure" },
      h("span", { class: "sv-muted", text: f.label + ": " }), h("b", { text: f.text }))))
    : null;
  return h("div", { class: "sv-advice-load sv-advice-load-on", title: ld.detail },
    h("div", { class: "sv-advice-load-h", text: ld.headline }), figures,
    ...ld.notes.map((n) => h("div", { class: "sv-muted sv-advice-load-note", text: n })));
}

/**
 * What the panel says under load (a batched run's advice: `a.parallel`, specviz/ui/parallel_advice.py), or
 * null: the best single setting for the run's load and its flags, what a load-aware schedule would add, the
 * break-even of the setting best alone, and where the batch cost came from (every figure Python's).
 */
export function adviceParallel(a) {
  const par = a && a.parallel;
  if (!par) return null;
  const single = par.best_single || {};
  const be = par.break_even_parallel;
  const alone = (par.by_parallel || []).find((r) => r.parallel === 1);
  const head = alone && alone.setting !== "none"
    ? "alone, " + alone.setting + " pays " + alone.predicted_speedup.toFixed(2) + "×; " +
      (be == null ? "it pays up to " + par.looked_up_to + " requests at once" : be === 1 ? "it does not pay even alone" : "it stops paying at " + be + " requests at once")
    : "plain decoding is best alone";
  const gain = par.load_aware_gain || 0;
  return { head, breakEven: be ?? null, single: single.setting || "none", flags: single.flags || "--spec-type none",
    gain: "a load-aware schedule (each concurrency's best) would add " + (gain >= 0 ? "+" : "") + (100 * gain).toFixed(1) + "% tokens",
    source: "batch cost " + (par.cost_source || "given") };
}

/** `{card, update(data), setPlotly(P)}`; `send(msg)` goes to the host (the Advise button). */
export function adviceView(send) {
  const btn = h("button", { class: "sv-btn sv-advise", title: "measure the verify cost and search draft_max / draft_min / draft_p_min" }, "Advise");
  const body = h("div", { class: "sv-advice-body" }, h("div", { class: "sv-muted", text: "Press Advise after some rounds: the advice replays them under other settings." }));
  const card = h("div", { class: "sv-card sv-advice-card" }, h("div", { class: "sv-card-h" }, h("span", { text: "Advice" }),
    h("span", { class: "sv-sub", text: "settings that pay on this machine" }), btn), body);
  btn.addEventListener("click", () => send(adviseMessage()));
  let Plotly = null, lastPar = null, parBox = null;

  function palette() {
    const cs = getComputedStyle(card);
    const v = (n) => cs.getPropertyValue(n).trim() || undefined;
    return { fg2: v("--sv-fg-2"), muted: v("--sv-muted"), grid: v("--sv-grid"), border: v("--sv-border"), blue: v("--sv-bonus-fg"),
      amber: v("--sv-corr-fg"), teal: v("--sv-draft-fg"), green: v("--sv-acc-fg"), red: v("--sv-rej-fg"), accent: v("--sv-accent") };
  }

  function drawParallel() {
    if (!Plotly || !lastPar || !parBox) return;
    const spec = parallelSpec(lastPar, { palette: palette() });
    if (spec.note) {
      parBox.replaceChildren(h("div", { class: "sv-chart-note", text: spec.note }));
      return;
    }
    Plotly.react(parBox, spec.data, spec.layout, { displayModeBar: false, responsive: false, doubleClick: false });
  }

  /** The under-load section: words, the chart box, a legend of the settings with their break-even. */
  function parallelSection(a) {
    lastPar = a.parallel || null;
    parBox = null;
    if (a.parallel_note) return h("div", { class: "sv-muted sv-advice-parallel-note", text: a.parallel_note });
    const p = adviceParallel(a);
    if (!p) return null;
    const spec = parallelSpec(lastPar, { palette: palette() });
    parBox = h("div", { class: "sv-chart sv-advice-parallel-chart" });
    const items = (spec.series || []).map((s) => h("span", { class: "sv-lg sv-advice-parallel-item", "data-break-even": s.breakEven == null ? "" : String(s.breakEven),
      title: s.flags }, h("i", { class: "sv-sw", style: "background:" + s.colour }), h("span", { text: s.label + ": " + s.text })));
    const one = (spec.series || []).length ? h("span", { class: "sv-lg" }, h("i", { class: "sv-sw sv-sw-batch-slots" }), h("span", { text: "plain decoding (1.0×)" })) : null;
    return h("div", { class: "sv-advice-parallel", "data-break-even": p.breakEven == null ? "" : String(p.breakEven) },
      h("div", { class: "sv-advice-parallel-h", text: "Under load: predicted speedup against requests at once" }),
      h("div", { class: "sv-muted", text: p.head }),
      h("div", { class: "sv-chart-legend sv-advice-parallel-legend" }, ...items, one), parBox,
      h("div", { class: "sv-advice-parallel-single" }, h("div", { text: "the best single setting for the run's load: " + p.single }),
        h("code", { class: "sv-flags", text: p.flags })),
      h("div", { class: "sv-muted", text: p.gain + " · " + p.source }));
  }

  function update(a) {
    if (!a) return;
    const flags = h("code", { class: "sv-flags", text: a.llama_cpp_flags || "" });
    const copy = h("button", { class: "sv-btn sv-copy", title: "copy the flags" }, "Copy");
    copy.addEventListener("click", () => {
      try {
        navigator.clipboard.writeText(a.llama_cpp_flags || "");
        copy.textContent = "Copied";
      } catch (e) {
        copy.textContent = "select and copy";
      }
    });
    const rows = Object.entries(a.per_strategy || {}).map(([name, c]) => {
      const cur = (a.current || {})[name];
      return h("tr", null, h("th", { text: name }), h("td", { text: "max " + c.draft_max + ", min " + c.draft_min + (c.draft_p_min != null ? ", p_min " + c.draft_p_min : "") }),
        h("td", { text: c.tokens_per_second.toFixed(1) + " t/s" }), h("td", { text: c.speedup.toFixed(2) + "×" }),
        h("td", { class: "sv-muted sv-advice-interval", title: "bootstrap interval over the recorded rounds", text: adviceInterval(c) }),
        h("td", { class: "sv-muted", text: cur ? "as run: " + cur.speedup.toFixed(2) + "×" : "" }));
    });
    body.replaceChildren(
      h("div", { class: "sv-advice-text", text: a.text }),
      a.reason ? h("div", { class: "sv-muted sv-advice-why", text: "why: " + a.reason }) : null,
      adviceLoadSection(a),
      a.llama_cpp_flags ? h("div", { class: "sv-flags-row" }, h("span", { class: "sv-lbl", text: "llama-server" }), flags, copy) : null,
      ...(a.flag_notes || []).map((n) => h("div", { class: "sv-muted sv-advice-note", text: "note: " + n })),
      rows.length ? h("table", { class: "sv-kvtable sv-advice-table" }, ...rows) : null,
      h("div", { class: "sv-muted", text: "plain decoding " + (a.baseline_tokens_per_second || 0).toFixed(1) + " t/s expected · verify cost " + a.cost_source }),
      ...(a.limits || []).map((l) => h("div", { class: "sv-muted sv-advice-limit", text: "limit: " + l })),
      parallelSection(a));
    drawParallel();
    card.dataset.parallel = a.parallel ? "yes" : a.parallel_note ? "note" : "";
    card.dataset.best = a.best ? a.best.strategy : "";
    card.dataset.pays = a.pays ? "yes" : "no";
    const load = adviceLoad(a);
    card.dataset.load = load ? load.verdict : "";
  }

  return { card, update, setPlotly: (P) => { Plotly = P; drawParallel(); } };
}
