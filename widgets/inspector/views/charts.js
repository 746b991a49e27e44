// The chart cards and their redraw scheduler.
//
// A plotly redraw is the expensive part of a frame (about 5–15 ms per chart on a small CPU, more with
// legends, unified hover or autoranged axes — so none of those are used: legends are HTML, the ranges
// are computed in chart_specs.js and the width comes from a ResizeObserver). A round only marks the
// charts dirty; one dirty chart is redrawn at most every CHART_GAP ms, round-robin, so no frame carries
// two redraws, most frames carry none, and the charts still trail the stream by well under a second.
// Where a redraw is slow (a small CPU, or many pages on one machine, as in a demo's load test) the gap
// grows with it (chartGap), so the charts never take more than about a tenth of the page's main thread.

import { CHART_ROUNDS, chartGap, chartSpec } from "../chart_specs.js";
import { h } from "../dom.js";
import { chartCard } from "./chart_card.js";
import { kvTimelineCard } from "./kv_timeline.js";

const PLOT_CONFIG = { displayModeBar: false, responsive: false, doubleClick: false };

/**
 * `{el, kv, keys, setPlotly(P), schedule(), mark(key), drawAll(staggered), drawOne(key), destroy()}`.
 * `getState()` and `getConfig()` give the current state and the host's control state; `root` is the
 * inspector's element (its CSS variables give the palette; data-chart-rounds says what is drawn).
 */
export function chartsView(root, getState, getConfig) {
  const kv = kvTimelineCard();
  const cards = [
    kv,
    chartCard("acc", "sv-acc-chart", "Acceptance rate", "per round (last " + CHART_ROUNDS + ") and cumulative",
      [["sv-sw-acc", "this round"], ["sv-sw-line", "cumulative"]]),
    chartCard("hist", "sv-hist", "Accepted length", "rounds by tokens committed (bonus/correction included)"),
    chartCard("pos", "sv-pos", "Per-position acceptance", "share of drafts reaching a depth that were accepted there"),
    chartCard("time", "sv-time", "Drafting vs verification", "ms per round; tokens/s so far",
      [["sv-sw-draft", "drafting ms"], ["sv-sw-verify", "verification ms"], ["sv-sw-tps", "tokens/s"]]),
    chartCard("conf", "sv-conf", "Draft confidence", "acceptance by the drafter's own probability",
      [["sv-sw-acc", "acceptance in bucket"], ["sv-sw-tries", "draft tokens"], ["sv-sw-pmin", "draft_p_min"]]),
    chartCard("tpr", "sv-tpr", "Tokens per round", "committed per round; policy's expectation",
      [["sv-sw-verify", "realised"], ["sv-sw-line", "realised (mean)"], ["sv-sw-exp", "expected (cost policy)"]]),
    chartCard("mem", "sv-mem", "Memory", "this run beside the same model under none; process resident and peak",
      [["sv-sw-mem-weights", "weights"], ["sv-sw-mem-kv", "KV cache"]]),
  ];
  const el = h("div", { class: "sv-charts" }, ...cards.map((c) => c.card));
  const byKey = new Map(cards.map((c) => [c.key, c]));

  let Plotly = null, destroyed = false;
  let timer = null, raf = null, lastDraw = 0, next = 0, drawMs = 0;
  const dirty = new Set();
  const widths = new Map();
  let palette = null;

  // the palette is read from the CSS variables once (getComputedStyle forces a style pass)
  function pal() {
    if (palette) return palette;
    const cs = getComputedStyle(root);
    const v = (n) => cs.getPropertyValue(n).trim() || undefined;
    palette = { fg2: v("--sv-fg-2"), muted: v("--sv-muted"), grid: v("--sv-grid"), border: v("--sv-border"),
      green: v("--sv-acc-fg"), red: v("--sv-rej-fg"), blue: v("--sv-bonus-fg"), amber: v("--sv-corr-fg"),
      teal: v("--sv-draft-fg"), tealBg: v("--sv-draft-rb"), slate: v("--sv-plain-fg"), accent: v("--sv-accent") };
    return palette;
  }

  function draw(c) {
    const spec = chartSpec(c.key, getState(), { palette: pal(), width: widths.get(c.key), config: getConfig() });
    if (!spec) return;
    if (spec.note != null) {
      c.show(false, spec.note);
      return;
    }
    if (!c.shown) c.show(true);
    if (spec.legend) {
      const sig = JSON.stringify(spec.legend);
      if (c.legendSig !== sig) {
        c.legendSig = sig;
        c.legend(spec.legend);
      }
    }
    if (spec.sub != null && c.subEl.textContent !== spec.sub) c.subEl.textContent = spec.sub;
    Plotly.react(c.box, spec.data, spec.layout, PLOT_CONFIG);
    // a card may act on a click on a bar (the KV timeline: rewind to that round); bound once plotted
    if (c.onPoint && !c.pointBound && typeof c.box.on === "function") {
      c.box.on("plotly_click", (d) => {
        if (d && d.points && d.points.length) c.onPoint(d.points[0]);
      });
      c.pointBound = true;
    }
  }

  const ro = typeof ResizeObserver === "function" ? new ResizeObserver((entries) => {
    for (const e of entries) {
      const c = cards.find((x) => x.box === e.target);
      const w = Math.round(e.contentRect.width);
      if (c && w > 0 && Math.abs((widths.get(c.key) || 0) - w) > 2) {
        widths.set(c.key, w);
        dirty.add(c.key);
        kick();
      }
    }
  }) : null;
  if (ro) for (const c of cards) ro.observe(c.box);

  function kick() {
    if (destroyed || !Plotly || timer != null || raf != null || !dirty.size) return;
    const wait = Math.max(0, chartGap(drawMs) - (performance.now() - lastDraw));
    timer = setTimeout(() => {
      timer = null;
      raf = requestAnimationFrame(drawNext);
    }, wait);
  }
  function drawNext() {
    raf = null;
    if (destroyed) return;
    for (let k = 0; k < cards.length; k++) {
      const i = (next + k) % cards.length;
      const c = cards[i];
      if (!dirty.has(c.key)) continue;
      dirty.delete(c.key);
      next = (i + 1) % cards.length;
      const t0 = performance.now();
      draw(c);
      lastDraw = performance.now();
      drawMs = drawMs ? 0.7 * drawMs + 0.3 * (lastDraw - t0) : lastDraw - t0; // a running mean of redraws
      break;
    }
    if (dirty.size) kick();
    else root.dataset.chartRounds = String(getState().rounds.length);
  }

  /** Mark every chart for the scheduler. */
  function schedule() {
    for (const c of cards) dirty.add(c.key);
    kick();
  }
  /** Mark one chart for the scheduler. */
  function mark(key) {
    dirty.add(key);
    kick();
  }
  /** Redraw every chart now (staggered=false: tests, benchmark) or mark them all for the scheduler. */
  function drawAll(staggered = true) {
    if (!Plotly) return;
    if (staggered) {
      schedule();
      return;
    }
    for (const c of cards) draw(c);
    dirty.clear();
    lastDraw = performance.now();
    root.dataset.chartRounds = String(getState().rounds.length);
  }
  /** Redraw one chart now (the benchmark times this). */
  function drawOne(key) {
    if (Plotly && byKey.has(key)) draw(byKey.get(key));
  }
  /** Plotly has arrived: drop the loading notes and draw. */
  function setPlotly(P) {
    Plotly = P;
    for (const b of el.querySelectorAll(".sv-chart-loading")) b.remove();
    drawAll();
  }
  function destroy() {
    destroyed = true;
    if (timer != null) clearTimeout(timer);
    if (raf != null) cancelAnimationFrame(raf);
    if (ro) ro.disconnect();
  }

  return { el, kv, keys: cards.map((c) => c.key), setPlotly, schedule, mark, drawAll, drawOne, destroy };
}
