// The verify batch of a batched run (several requests at once, llama-server's -np slots): for one step, a
// row per slot with the request it served and the rows it put in the step's one decode (its pending token,
// then its draft: accepted tokens coloured as the stream colours them, rejected ones struck through), and
// the busy sequences of every step as a chart (a click on a bar shows that step). The card shows only when
// the stream holds batch_step events; it follows the newest step until another step is picked.

import { batchSummary, shownStep, stepLanes } from "../batch_specs.js";
import { busySpec, busyWindow } from "../chart_specs.js";
import { h } from "../dom.js";
import { tokenClass } from "./token_class.js";

const BATCH_PLOT = { displayModeBar: false, responsive: false, doubleClick: false };
/** Milliseconds between two redraws of the busy chart while steps stream in, at the least. */
const BUSY_GAP = 150;

/** `{card, update(state), setPlotly(P)}`; `root` is the inspector's element (its CSS variables give the palette). */
export function batchView(root) {
  const sub = h("span", { class: "sv-sub sv-batch-sub" });
  const slider = h("input", { class: "sv-batch-slider", type: "range", min: "0", max: "0", value: "0", title: "the step shown" });
  const stepText = h("span", { class: "sv-batch-steptext" });
  const slots = h("div", { class: "sv-batch-slots" });
  const chartBox = h("div", { class: "sv-chart sv-batch-busy" });
  const chartNote = h("div", { class: "sv-chart-note", hidden: true });
  const legend = h("div", { class: "sv-chart-legend" });
  const card = h("div", { class: "sv-card sv-batch-card", hidden: true },
    h("div", { class: "sv-card-h" }, h("span", { text: "Verify batch" }), sub),
    h("div", { class: "sv-batch-nav" }, h("span", { class: "sv-lbl", text: "step" }), slider, stepText),
    slots, h("div", { class: "sv-batch-chart-h sv-muted", text: "busy sequences over time" }), legend, chartBox, chartNote);

  let Plotly = null, batch = null, want = null, timer = null, lastDraw = 0, bound = false;
  slider.addEventListener("input", () => {
    const i = Number(slider.value);
    want = batch && i >= batch.steps.length - 1 ? null : i; // at the end: follow the newest step again
    showStep();
    scheduleChart();
  });

  function palette() {
    const cs = getComputedStyle(root);
    const v = (n) => cs.getPropertyValue(n).trim() || undefined;
    return { fg2: v("--sv-fg-2"), muted: v("--sv-muted"), grid: v("--sv-grid"), border: v("--sv-border"), blue: v("--sv-bonus-fg"),
      amber: v("--sv-corr-fg"), accent: v("--sv-accent") };
  }

  function cellEl(c) {
    if (c.kind === "pending") return h("span", { class: "sv-batch-cell sv-batch-pending", title: "its pending token (the last one it committed)" });
    const status = c.kind === "accepted" ? "accepted" : c.kind === "rejected" ? "rejected" : "plain";
    return h("span", { class: "sv-batch-cell sv-tok " + tokenClass({ status }), title: "draft token " + (c.depth + 1) + ": " + c.kind });
  }

  function slotEl(s) {
    if (s.idle) {
      return h("div", { class: "sv-batch-slot sv-batch-idle", "data-slot": String(s.slot), "data-rows": "0" },
        h("span", { class: "sv-batch-slotname", text: "slot " + s.slot }), h("span", { class: "sv-muted", text: "idle" }));
    }
    const e = h("div", { class: "sv-batch-slot" + (s.followed ? " sv-batch-followed" : ""), "data-slot": String(s.slot),
      "data-request": String(s.request), "data-rows": String(s.rows), "data-accepted": String(s.accepted) },
    h("span", { class: "sv-batch-slotname", text: "slot " + s.slot }),
    h("span", { class: "sv-batch-req", title: "request " + s.request + ", its round " + s.round + " at position " + s.position +
      (s.followed ? " (the token stream shows this request)" : ""), text: "request " + s.request + " · round " + s.round }),
    h("span", { class: "sv-batch-cells" }, ...s.cells.map(cellEl)),
    h("span", { class: "sv-muted sv-batch-text", text: s.text }));
    return e;
  }

  function showStep() {
    const i = shownStep(batch, want);
    const L = stepLanes(batch, i);
    slider.max = String(Math.max(0, batch.steps.length - 1));
    slider.value = String(Math.max(0, i));
    card.dataset.step = L ? String(L.step) : "";
    if (!L) {
      stepText.textContent = "";
      slots.replaceChildren();
      return;
    }
    stepText.textContent = L.step + " of " + batch.steps.length + " · " + L.busy + " busy, " + L.rows + " rows in one decode (" +
      L.decodeMs.toFixed(2) + " ms)" + (L.queued ? " · " + L.queued + " queued" : "");
    slots.replaceChildren(...L.slots.map(slotEl));
  }

  function drawChart() {
    timer = null;
    if (!Plotly || !batch) return;
    lastDraw = performance.now();
    const i = shownStep(batch, want);
    const st = stepLanes(batch, i);
    const spec = busySpec(batch, { palette: palette(), selected: st ? st.step : null });
    chartNote.hidden = !spec.note;
    chartBox.hidden = !!spec.note;
    if (spec.note) {
      chartNote.textContent = spec.note;
      return;
    }
    legend.replaceChildren(...spec.legend.map(([sw, text]) => h("span", { class: "sv-lg" }, h("i", { class: "sv-sw " + sw }), h("span", { text }))));
    Plotly.react(chartBox, spec.data, spec.layout, BATCH_PLOT);
    card.dataset.chartSteps = String(busyWindow(batch).length);
    if (!bound && typeof chartBox.on === "function") {
      chartBox.on("plotly_click", (d) => { // a bar: show its step
        const x = d && d.points && d.points.length ? d.points[0].x : null;
        if (!batch || !Number.isInteger(x)) return;
        const w = busyWindow(batch), j = w.findIndex((st) => st.step === x);
        if (j < 0) return;
        const idx = batch.steps.length - w.length + j;
        want = idx >= batch.steps.length - 1 ? null : idx;
        showStep();
        scheduleChart();
      });
      bound = true;
    }
  }
  function scheduleChart() {
    if (timer != null) return;
    timer = setTimeout(drawChart, Math.max(0, BUSY_GAP - (performance.now() - lastDraw)));
  }

  /** The state after an events message: shown, and redrawn, only when it holds a batched run's steps. */
  function update(state) {
    const b = state.batch;
    card.hidden = !b;
    if (b === batch) return;
    batch = b;
    if (!b) return;
    sub.textContent = batchSummary(b);
    card.dataset.steps = String(b.steps.length);
    card.dataset.busy = busyWindow(b).map((s) => s.busy).join(",");
    showStep();
    scheduleChart();
  }

  return { card, update, setPlotly: (P) => { Plotly = P; scheduleChart(); } };
}
