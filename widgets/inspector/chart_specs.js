// Chart specifications: pure functions from the state to plotly {data, layout} (no DOM, no plotly).
//
// chartSpec(key, state, opts) returns {data, layout, legend?, sub?} to draw, {note} when the chart has
// nothing to show (the card shows the note instead), or null for an unknown key. `opts` carries what
// is not in the event state: the palette (colours read from the page's CSS), the plot's width in pixels
// (undefined: autosize) and the host's control state (`config.strategy`, `config.knobs`).
// Ranges are computed here (autorange is slow) and legends are HTML (see views/charts.js).

import { seqSlice } from "./seq.js";

/** Per-round charts show the most recent rounds (fewer SVG nodes per redraw). */
export const CHART_ROUNDS = 60;
/** The KV timeline shows fewer rounds: two bars per context and round. */
export const KV_ROUNDS = 30;
/** Chart keys, in page order. */
export const CHART_KEYS = ["kv", "acc", "hist", "pos", "time", "conf", "tpr", "mem"];

/** Milliseconds between two chart redraws (one chart each) while rounds stream in, at the least. */
export const CHART_GAP = 90;
/** ... and at the most: a page keeps redrawing its charts, however slow a redraw is. */
export const CHART_GAP_MAX = 600;

/**
 * The gap before the next chart redraw, given the running mean of a redraw's duration (ms): nine times
 * the redraw, so redraws take at most a tenth of the main thread, within [CHART_GAP, CHART_GAP_MAX].
 */
export function chartGap(drawMs) {
  const d = Number.isFinite(drawMs) && drawMs > 0 ? drawMs : 0;
  return Math.min(CHART_GAP_MAX, Math.max(CHART_GAP, 9 * d));
}

/** The spec of chart `key` for `state` (see the top of this file). */
export function chartSpec(key, state, opts) {
  const fn = SPECS[key];
  return fn ? fn(state, { palette: {}, config: {}, ...opts }) : null;
}

const SPECS = { kv: kvSpec, acc: accSpec, hist: histSpec, pos: posSpec, time: timeSpec, conf: confSpec, tpr: tprSpec, mem: memSpec };

/** A plot layout: fixed height and margins, transparent background, no plotly legend. */
export function baseLayout(o, extra) {
  const p = o.palette;
  return {
    height: 210, margin: { l: 46, r: 14, t: 8, b: 36 }, autosize: !o.width, width: o.width || undefined,
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 11.5, color: p.fg2 },
    showlegend: false, hovermode: "closest", bargap: 0.18,
    hoverlabel: { font: { size: 12 } },
    ...extra,
  };
}

/** An axis with a fixed range. */
function ax(o, range, extra) {
  const p = o.palette;
  return { range, autorange: false, fixedrange: true, gridcolor: p.grid, zeroline: false, linecolor: p.border, ticks: "",
    automargin: false, ...extra };
}
const axTitle = (text) => ({ text, font: { size: 11 }, standoff: 6 });
const pctAxis = (o) => ax(o, [0, 1.05], { tickvals: [0, 0.25, 0.5, 0.75, 1], ticktext: ["0%", "25%", "50%", "75%", "100%"] });

/** The x range covering rounds `rs` (a window of round summaries). */
export function roundRange(rs) {
  if (!rs.length) return [0.5, 1.5];
  return [rs[0].round - 0.6, rs[rs.length - 1].round + 0.6];
}

/** A "nice" axis maximum (1, 1.2, 1.5, 2, 2.5 … × 10^k) at or above x, so ticks land on round numbers. */
export function nice(x) {
  if (!(x > 0)) return 1;
  const e = Math.pow(10, Math.floor(Math.log10(x)));
  for (const m of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * e >= x) return m * e;
  return 10 * e;
}

/** The largest / smallest non-null value of xs, or `d` when there is none. */
export function maxOf(xs, d = 1) {
  let m = -Infinity;
  for (const x of xs) if (x != null && x > m) m = x;
  return m === -Infinity ? d : m;
}
export function minOf(xs, d = 0) {
  let m = Infinity;
  for (const x of xs) if (x != null && x < m) m = x;
  return m === Infinity ? d : m;
}

/** The most recent CHART_ROUNDS round summaries. */
export function chartWindow(state) {
  return seqSlice(state.rounds, -CHART_ROUNDS);
}

/** Target rollback paths that restored a saved state instead of removing a tail (backends/memory.py). */
export const RESTORE_PATHS = ["checkpoint", "reprefill"];

const restored = (r) => !!(r.rollbacks && r.rollbacks.target && RESTORE_PATHS.includes(r.rollbacks.target.path));

/** A byte count for people: B, KiB, MiB or GiB. */
export function fmtBytes(n) {
  if (n == null || !Number.isFinite(n)) return "?";
  const u = ["B", "KiB", "MiB", "GiB"];
  let i = 0, x = n;
  while (x >= 1024 && i < u.length - 1) {
    x /= 1024;
    i += 1;
  }
  return (i ? x.toFixed(x < 10 ? 2 : 1) : String(Math.round(x))) + " " + u[i];
}

// KV cache timeline: per round, the target context's length before the verify batch → its peak → its
// length after the rollback, as a committed bar and a rolled-back bar stacked on it; the draft model's
// context beside it when there is one, and the sliding window's start when the context outgrows it.
// Memory that cannot drop a tail (recurrent, hybrid) rolls back by restoring a checkpoint: those rounds'
// rolled-back bars are drawn apart ("restored a checkpoint"), with the checkpoint's position marked.
function kvSpec(state, o) {
  const p = o.palette;
  const kv = seqSlice(state.rounds, -KV_ROUNDS), xs = kv.map((r) => r.round);
  const t = kv.map((r) => r.kv), d = kv.map((r) => r.draftKv);
  const draft = state.hasDraftKV;
  const isRestore = kv.map(restored);
  const rolledY = t.map((k, i) => (isRestore[i] ? 0 : (k.peak ?? 0) - (k.after ?? k.peak ?? 0)));
  const data = [
    { type: "bar", x: xs, base: t.map((k) => k.before), y: t.map((k) => (k.after ?? k.peak ?? 0) - (k.before ?? 0)),
      offsetgroup: "t", marker: { color: p.green }, customdata: t.map((k) => [k.before, k.peak, k.after]),
      hovertemplate: "round %{x}<br>target: %{customdata[0]} → peak %{customdata[1]} → %{customdata[2]}<extra></extra>" },
    { type: "bar", x: xs, base: t.map((k) => k.after), y: rolledY,
      offsetgroup: "t", marker: { color: p.red, opacity: 0.85 }, customdata: t.map((k) => k.peak),
      hovertemplate: "round %{x}<br>target rollback: removed [%{base}, %{customdata})<extra></extra>" },
  ];
  const legend = [["sv-sw-tc", "target: committed"], ["sv-sw-tr", "target: rolled back"]];
  if (isRestore.some(Boolean)) {
    const rb = kv.map((r) => (restored(r) ? r.rollbacks.target : null));
    data.push({ type: "bar", x: xs, base: t.map((k) => k.after), offsetgroup: "t",
      y: t.map((k, i) => (isRestore[i] ? (k.peak ?? 0) - (k.after ?? k.peak ?? 0) : 0)),
      marker: { color: p.blue, opacity: 0.85, pattern: { shape: "/", fgcolor: p.fg2, size: 5 } },
      customdata: rb.map((e) => (e ? [e.path === "reprefill" ? "nothing saved: re-evaluated from 0" : "restored the state saved at " + e.mark_pos,
        e.reapplied, fmtBytes(e.nbytes), (e.seconds * 1000).toFixed(2)] : ["", 0, "", ""])),
      hovertemplate: "round %{x}<br>target rollback: %{customdata[0]}, re-applied %{customdata[1]} token(s)<br>%{customdata[2]}, " +
        "%{customdata[3]} ms<extra></extra>" });
    legend.push(["sv-sw-restore", "target: restored a checkpoint"]);
  }
  const ck = kv.map((r) => (r.checkpoints && r.checkpoints.target ? r.checkpoints.target : null));
  if (ck.some(Boolean)) {
    const at = ck.map((e, i) => (e ? i : -1)).filter((i) => i >= 0);
    data.push({ type: "scatter", mode: "markers", x: at.map((i) => xs[i]), y: at.map((i) => ck[i].position),
      marker: { symbol: "diamond", size: 8, color: p.blue, line: { width: 1, color: p.fg2 } },
      customdata: at.map((i) => [fmtBytes(ck[i].nbytes), (ck[i].seconds * 1000).toFixed(2), ck[i].reused ? " (reused)" : "", ck[i].reason]),
      hovertemplate: "round %{x}: checkpoint saved at %{y}%{customdata[2]}<br>%{customdata[0]}, %{customdata[1]} ms<br>%{customdata[3]}<extra></extra>" });
    legend.push(["sv-sw-ckpt", "checkpoint saved"]);
  }
  if (draft) {
    data.push(
      { type: "bar", x: xs, base: d.map((k) => k.before), y: d.map((k) => (k.after ?? k.peak ?? 0) - (k.before ?? 0)),
        offsetgroup: "d", marker: { color: p.teal }, customdata: d.map((k) => [k.before, k.peak, k.after]),
        hovertemplate: "round %{x}<br>draft ctx: %{customdata[0]} → peak %{customdata[1]} → %{customdata[2]}<extra></extra>" },
      { type: "bar", x: xs, base: d.map((k) => k.after), y: d.map((k) => (k.peak ?? 0) - (k.after ?? k.peak ?? 0)),
        offsetgroup: "d", marker: { color: p.amber, opacity: 0.85 }, customdata: d.map((k) => k.peak),
        hovertemplate: "round %{x}<br>draft rollback: removed [%{base}, %{customdata})<extra></extra>" });
    legend.push(["sv-sw-dc", "draft ctx: committed"], ["sv-sw-dr", "draft ctx: rolled back"]);
  }
  const ys = kv.flatMap((r) => [r.kv.before, r.kv.peak, r.kv.after, r.draftKv.before, r.draftKv.peak]);
  let lo = minOf(ys, 0);
  const hi = maxOf(ys, 1);
  const nswa = state.started ? state.started.n_swa : 0;
  if (nswa > 0 && kv.length && maxOf(t.map((k) => k.after), 0) > nswa) {
    data.push({ type: "scatter", mode: "lines", x: xs, y: t.map((k) => Math.max(0, (k.after ?? 0) - nswa)),
      line: { dash: "dot", color: p.blue, width: 1.5 }, hovertemplate: "oldest attended position %{y} (window " + nswa + ")<extra></extra>" });
    lo = Math.min(lo, Math.max(0, (t[0].after ?? 0) - nswa));
    legend.push(["sv-sw-swa", "sliding-window start"]);
  }
  const pad = Math.max(2, Math.round((hi - lo) * 0.06));
  return { legend, data, layout: baseLayout(o, { height: 240, barmode: draft ? "group" : "overlay", bargap: 0.3, bargroupgap: 0.08,
    shapes: [], xaxis: ax(o, roundRange(kv), { title: axTitle("round") }),
    yaxis: ax(o, [Math.max(0, lo - pad), hi + pad], { title: axTitle("KV position") }) }) };
}

// Acceptance rate: each round's share of draft tokens accepted, and the cumulative rate.
function accSpec(state, o) {
  const p = o.palette, w = chartWindow(state), wx = w.map((r) => r.round);
  return { data: [
    { type: "bar", x: wx, y: w.map((r) => r.rate), marker: { color: p.green, opacity: 0.55 },
      customdata: w.map((r) => [r.accepted, r.drafted]), hovertemplate: "round %{x}: %{customdata[0]}/%{customdata[1]} accepted<extra></extra>" },
    { type: "scatter", mode: "lines", x: wx, y: w.map((r) => r.cumRate), line: { color: p.blue, width: 2.5, shape: "hv" },
      hovertemplate: "cumulative %{y:.1%}<extra></extra>" },
  ], layout: baseLayout(o, { xaxis: ax(o, roundRange(w), { title: axTitle("round") }), yaxis: pctAxis(o) }) };
}

// Accepted length: rounds by the number of tokens they committed (every round since the start).
function histSpec(state, o) {
  const p = o.palette, hx = [], hy = [];
  for (let i = 1; i < state.hist.length; i++) {
    hx.push(i);
    hy.push(state.hist[i] || 0);
  }
  const n = Math.max(2, state.hist.length);
  return { data: [{ type: "bar", x: hx, y: hy, marker: { color: p.blue }, hovertemplate: "%{y} rounds committed %{x} token(s)<extra></extra>" }],
    layout: baseLayout(o, { xaxis: ax(o, [0.4, n - 0.4], { dtick: n > 20 ? 2 : 1, title: axTitle("tokens committed in the round") }),
      yaxis: ax(o, [0, nice(Math.max(1, maxOf(hy, 1)) * 1.05)], { title: axTitle("rounds") }) }) };
}

// Per-position acceptance, from the telemetry: of the drafts reaching a depth, the share accepted there.
function posSpec(state, o) {
  const p = o.palette, pa = state.posAcc || [], tries = state.posTries || [];
  if (!pa.length) return { note: "No draft tokens yet: per-position acceptance appears once the strategy drafts." };
  return { data: [{ type: "bar", x: pa.map((_, i) => i + 1), y: pa, marker: { color: p.green }, customdata: pa.map((_, i) => tries[i] ?? ""),
    hovertemplate: "depth %{x}: %{y:.1%} of %{customdata} drafts<extra></extra>" }],
  layout: baseLayout(o, { yaxis: pctAxis(o), xaxis: ax(o, [0.4, pa.length + 0.6], { dtick: pa.length > 20 ? 2 : 1, title: axTitle("draft position") }) }) };
}

// Drafting vs verification: stacked ms per round, and tokens/s so far on a second axis.
function timeSpec(state, o) {
  const p = o.palette, w = chartWindow(state), wx = w.map((r) => r.round);
  const stackMax = maxOf(w.map((r) => (r.draftMs || 0) + (r.verifyMs || 0)), 1);
  const tpsMax = maxOf(w.map((r) => r.tps), 1);
  return { data: [
    { type: "scatter", mode: "lines", stackgroup: "t", x: wx, y: w.map((r) => r.draftMs), line: { color: p.amber, width: 1 },
      hovertemplate: "round %{x}: drafting %{y:.1f} ms<extra></extra>" },
    { type: "scatter", mode: "lines", stackgroup: "t", x: wx, y: w.map((r) => r.verifyMs), line: { color: p.blue, width: 1 },
      hovertemplate: "round %{x}: verification %{y:.1f} ms<extra></extra>" },
    { type: "scatter", mode: "lines", x: wx, y: w.map((r) => r.tps), yaxis: "y2", line: { color: p.green, width: 2.5 },
      hovertemplate: "%{y:.1f} tokens/s so far<extra></extra>" },
  ], layout: baseLayout(o, { margin: { l: 46, r: 46, t: 8, b: 36 }, xaxis: ax(o, roundRange(w), { title: axTitle("round") }),
    yaxis: ax(o, [0, nice(stackMax * 1.05)], { title: axTitle("ms") }),
    yaxis2: ax(o, [0, nice(tpsMax * 1.05)], { tickmode: "auto", nticks: 5, overlaying: "y", side: "right", showgrid: false, title: axTitle("tok/s") }) }) };
}

/** Strategies that draft with a model and so give each draft token a probability (and a draft_p_min). */
export const MODEL_DRAFTERS = ["draft", "eagle3", "mtp"];

// Draft confidence: acceptance by the drafter's own probability of its token (telemetry buckets), with
// a model drafter's draft_p_min marked; a note explains an empty chart.
function confSpec(state, o) {
  const p = o.palette, cfg = o.config || {};
  const bs = (state.tel && state.tel.draft_buckets) || [];
  const total = bs.reduce((a, b) => a + (b.tries || 0), 0);
  const modelDrafter = MODEL_DRAFTERS.includes(cfg.strategy);
  if (!total) {
    const modelDraft = modelDrafter || (state.started && state.started.draft_model);
    return { note: modelDraft ? "No draft tokens yet: this chart fills as the draft model proposes tokens."
      : "No drafter probabilities: " + (cfg.strategy || "this strategy") + " drafts without a probability (n-gram strategies copy " +
        "tokens). Choose a model drafter (draft, eagle3, mtp) to see whether the draft's confidence predicts acceptance — the chart draft_p_min is tuned from." };
  }
  const xs = bs.map((b) => (b.lo + b.hi) / 2);
  const pmin = modelDrafter && cfg.knobs ? cfg.knobs.draft_p_min : null;
  const shapes = pmin != null ? [{ type: "line", x0: pmin, x1: pmin, y0: 0, y1: 1.05, yref: "y", line: { color: p.red, width: 2, dash: "dash" } }] : [];
  const legend = [["sv-sw-acc", "acceptance in bucket"], ["sv-sw-tries", "draft tokens"]];
  if (pmin != null) legend.push(["sv-sw-pmin", "draft_p_min = " + pmin]);
  return { data: [
    { type: "bar", x: xs, y: bs.map((b) => (b.tries ? b.rate : null)), width: 0.085, marker: { color: p.green },
      customdata: bs.map((b) => [b.lo, b.hi, b.accepted, b.tries]),
      hovertemplate: "draft p in [%{customdata[0]}, %{customdata[1]}): %{customdata[2]}/%{customdata[3]} accepted (%{y:.0%})<extra></extra>" },
    { type: "scatter", mode: "lines+markers", x: xs, y: bs.map((b) => b.tries), yaxis: "y2", line: { color: p.muted, width: 1.5, dash: "dot" },
      marker: { size: 5, color: p.muted }, hovertemplate: "%{y} draft tokens<extra></extra>" },
  ], legend,
  layout: baseLayout(o, { shapes, margin: { l: 46, r: 46, t: 8, b: 36 },
    xaxis: ax(o, [0, 1], { dtick: 0.1, tickformat: ".1f", title: axTitle("draft model's probability of its token") }), yaxis: pctAxis(o),
    yaxis2: ax(o, [0, nice(maxOf(bs.map((b) => b.tries), 1) * 1.05)], { tickmode: "auto", nticks: 5, overlaying: "y", side: "right", showgrid: false, title: axTitle("tokens") }) }) };
}

// Tokens per round: committed each round and the running mean; with the cost policy, its expectation.
function tprSpec(state, o) {
  const p = o.palette, w = chartWindow(state), wx = w.map((r) => r.round);
  const exp = state.hasExpected;
  const data = [
    { type: "bar", x: wx, y: w.map((r) => r.committed), marker: { color: p.blue, opacity: 0.45 },
      hovertemplate: "round %{x}: %{y} committed<extra></extra>" },
    { type: "scatter", mode: "lines", x: wx, y: w.map((r) => r.tpr), line: { color: p.blue, width: 2.5 },
      hovertemplate: "mean %{y:.2f} tokens/round<extra></extra>" },
  ];
  const legend = [["sv-sw-verify", "committed this round"], ["sv-sw-line", "mean tokens/round"]];
  if (exp) {
    data.push(
      { type: "scatter", mode: "markers", x: wx, y: w.map((r) => r.expected), marker: { symbol: "line-ew-open", size: 9, color: p.amber, line: { width: 2, color: p.amber } },
        hovertemplate: "round %{x}: expected %{y:.2f}<extra></extra>" },
      { type: "scatter", mode: "lines", x: wx, y: w.map((r) => r.expectedMean), line: { color: p.amber, width: 2, dash: "dash" },
        hovertemplate: "mean expected %{y:.2f} tokens/round<extra></extra>" });
    legend.push(["sv-sw-tick", "expected this round"], ["sv-sw-exp", "mean expected (cost policy)"]);
  }
  const top = maxOf(w.map((r) => Math.max(r.committed || 0, r.expected || 0)), 1);
  return { data, legend, sub: exp ? "realised vs the cost policy's expectation" : "realised; the expectation shows with draft_policy = cost",
    layout: baseLayout(o, { xaxis: ax(o, roundRange(w), { title: axTitle("round") }),
      yaxis: ax(o, [0, nice(Math.max(2, top) * 1.05)], { title: axTitle("tokens") }) }) };
}

/** The memory chart's parts, in stacking order: [key, label, palette colour]. */
export const MEMORY_PARTS = [
  ["weights", "weights", "muted"], ["kv", "KV cache", "green"], ["swa", "sliding-window KV", "teal"],
  ["recurrent", "recurrent state", "amber"], ["draft", "draft model", "blue"], ["marks", "saved states", "red"],
];

// Memory: what this run holds (the target's weights and caches, the draft model's, the saved states for
// rollbacks and rewinds) beside what the same model holds under `none`, as stacked horizontal bars in
// MiB; the sub line gives the process's resident and peak memory, the machine's thermal and clock
// figures ("not available" where the machine exposes none) and the CPU share the run had (see cpuShare).
function memSpec(state, o) {
  const p = o.palette, m = state.memory;
  if (!m) return { note: "No memory figures yet: they come with the first round's telemetry." };
  const mib = (b) => b / 1048576;
  const rows = ["none", "this run"];
  const data = MEMORY_PARTS.filter(([k]) => m.run[k] || m.none[k]).map(([k, label, colour]) => ({
    type: "bar", orientation: "h", y: rows, x: [mib(m.none[k]), mib(m.run[k])], name: label, marker: { color: p[colour] },
    customdata: [fmtBytes(m.none[k]), fmtBytes(m.run[k])],
    hovertemplate: "%{y}: " + label + " %{customdata}<extra></extra>" }));
  const total = (parts) => MEMORY_PARTS.reduce((a, [k]) => a + (parts[k] || 0), 0);
  const top = nice(Math.max(mib(total(m.run)), mib(total(m.none)), 0.001) * 1.05);
  const legend = MEMORY_PARTS.filter(([k]) => m.run[k] || m.none[k]).map(([k, label]) => ["sv-sw-mem-" + k, label]);
  const mach = m.machine || {};
  const fig = (f, unit) => (!f ? "not available" : f.available ? f.mean.toFixed(unit === "MHz" ? 0 : 1) + " " + unit + " (max " +
    f.max.toFixed(unit === "MHz" ? 0 : 1) + ")" : "not available");
  const sub = m.kind + " memory; process resident " + fmtBytes(m.rss) + ", peak " + fmtBytes(m.peak) + "; temperature " +
    fig(mach.thermal_c, "°C") + ", CPU clock " + fig(mach.cpu_mhz, "MHz") + (m.cpu ? "; " + m.cpu.text : "");
  return { data, legend, sub, layout: baseLayout(o, { height: 150, barmode: "stack", bargap: 0.35, margin: { l: 64, r: 14, t: 8, b: 36 },
    xaxis: ax(o, [0, top], { title: axTitle("MiB") }), yaxis: { type: "category", fixedrange: true, automargin: false } }) };
}

/** The busy-sequences chart shows the most recent steps of a batched run. */
export const BATCH_STEPS = 120;

/** The steps the busy-sequences chart draws: the most recent BATCH_STEPS summaries (state.js batchStep). */
export function busyWindow(batch) {
  return batch ? seqSlice(batch.steps, -BATCH_STEPS) : [];
}

// Busy sequences over time (a batched run; not one of CHART_KEYS: the batch view draws it): per step the
// sequences in its decode, the requests still queued, the slots as a dashed line; `selected` (a step number)
// is drawn in the accent colour. A click on a bar selects its step (views/batch.js).
export function busySpec(batch, o) {
  const p = o.palette || {}, w = busyWindow(batch);
  if (!w.length) return { note: "No steps yet: the lanes fill as the batched run steps." };
  const xs = w.map((s) => s.step), slots = batch.nParallel;
  const colours = w.map((s) => (s.step === o.selected ? p.accent : p.blue));
  const top = nice(Math.max(slots, maxOf(w.map((s) => s.queued), 0), 1) * 1.1);
  const range = [xs[0] - 0.6, xs[xs.length - 1] + 0.6];
  return { data: [
    { type: "bar", x: xs, y: w.map((s) => s.busy), marker: { color: colours, opacity: w.map((s) => (s.step === o.selected ? 1 : 0.55)) },
      customdata: w.map((s) => [s.rows, s.decodeMs.toFixed(2), s.queued]),
      hovertemplate: "step %{x}: %{y} busy, %{customdata[0]} rows in the decode (%{customdata[1]} ms), %{customdata[2]} queued<extra></extra>" },
    { type: "scatter", mode: "lines", x: xs, y: w.map((s) => s.queued), line: { color: p.amber, width: 1.5, dash: "dot", shape: "hv" },
      hovertemplate: "step %{x}: %{y} queued<extra></extra>" },
  ], legend: [["sv-sw-verify", "busy sequences in the decode"], ["sv-sw-batch-queued", "requests queued"], ["sv-sw-batch-slots", "slots (" + slots + ")"]],
  layout: baseLayout(o, { height: 170, bargap: 0.15,
    shapes: [{ type: "line", xref: "x", x0: range[0], x1: range[1], y0: slots, y1: slots, line: { color: p.muted, width: 1, dash: "dash" } }],
    xaxis: ax(o, range, { title: axTitle("step") }), yaxis: ax(o, [0, top], { title: axTitle("sequences"), dtick: top <= 10 ? 1 : undefined }) }) };
}

/** Colours of the settings in the speedup-against-concurrency chart, in order (palette keys). */
export const SETTING_COLOURS = ["blue", "amber", "teal", "green", "red", "accent"];

/**
 * Predicted speedup against concurrency (the advice's `parallel` part: specviz.analysis.advise_parallel
 * ParallelAdvice.to_dict): a line per setting but plain decoding, the 1.0 line (plain decoding at the same
 * concurrency), and each setting's break-even concurrency (the least at which it no longer beats plain
 * decoding) marked on it with a dotted line. `series` says, per setting, its colour and where it stops
 * paying, for the view's legend.
 */
export function parallelSpec(par, o) {
  const p = o.palette || {};
  const entries = Object.entries((par && par.settings) || {}).filter(([label]) => label !== "none");
  if (!entries.length) return { note: "No setting beats plain decoding at any concurrency looked at: nothing to draw but the 1.0 line." };
  const data = [], shapes = [], series = [];
  let xMax = 1, yLo = 1, yHi = 1;
  entries.forEach(([label, s], k) => {
    const colour = p[SETTING_COLOURS[k % SETTING_COLOURS.length]];
    const pts = Object.entries(s.speedups || {}).map(([c, x]) => [Number(c), x]).sort((a, b) => a[0] - b[0]);
    const xs = pts.map((q) => q[0]), ys = pts.map((q) => q[1]);
    xMax = Math.max(xMax, ...xs);
    yLo = Math.min(yLo, ...ys);
    yHi = Math.max(yHi, ...ys);
    data.push({ type: "scatter", mode: "lines+markers", x: xs, y: ys, name: label, line: { color: colour, width: 2.5 },
      marker: { size: 6, color: colour }, hovertemplate: label + "<br>%{x} at once: %{y:.2f}×<extra></extra>" });
    const be = s.break_even_parallel;
    if (be != null) {
      const at = pts.find((q) => q[0] === be);
      const y = at ? at[1] : 1.0;
      xMax = Math.max(xMax, be);
      data.push({ type: "scatter", mode: "markers+text", x: [be], y: [y], text: ["break-even " + be], textposition: k % 2 ? "bottom center" : "top center", // neighbours apart
        textfont: { size: 10.5, color: colour }, marker: { symbol: "x-thin-open", size: 13, color: colour, line: { width: 2.5, color: colour } },
        hovertemplate: label + " stops paying at %{x} requests at once<extra></extra>" });
      shapes.push({ type: "line", xref: "x", yref: "paper", x0: be, x1: be, y0: 0, y1: 1, line: { color: colour, width: 1, dash: "dot" } });
    }
    const text = be == null ? "pays up to " + (par.looked_up_to || xMax) + " at once" : be === 1 ? "does not pay even alone" : "break-even at " + be;
    series.push({ label, colour, breakEven: be ?? null, text, flags: s.flags || "" });
  });
  shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: 1, y1: 1, line: { color: p.muted, width: 1.5, dash: "dash" } });
  const pad = Math.max(0.05, (yHi - yLo) * 0.12);
  return { data, series, breakEven: par.break_even_parallel ?? null,
    layout: baseLayout(o, { height: 230, shapes, margin: { l: 46, r: 14, t: 14, b: 36 },
      xaxis: ax(o, [0.5, xMax + 0.7], { title: axTitle("requests at once (llama-server -np)"), dtick: xMax > 16 ? undefined : 1 }),
      yaxis: ax(o, [Math.max(0, yLo - pad), yHi + 2 * pad], { title: axTitle("speedup over plain"), tickformat: ".2f" }) }) };
}
