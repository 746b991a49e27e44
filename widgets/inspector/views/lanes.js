// The comparison lanes: a second lane (a branch of the session, or the same prompt from the start with
// another setting) beside the session's own, token streams aligned by position with the first divergence
// marked, the figures of both, per-position acceptance overlaid, and the difference in words (all computed
// in Python: specviz.compare). The controls send "lane" messages; Python checks them.

import { alignLanes, laneFigureRows, laneOverlaySpec } from "../compare_specs.js";
import { h } from "../dom.js";
import { knobText, showPiece } from "../format.js";
import { laneMessage, laneSettingMessage } from "../messages.js";
import { tokenClass } from "./token_class.js";

/** `{card, update(msg), setPlotly(P), sync(config)}`; `send(msg)` goes to the host. */
export function lanesView(send) {
  const strat = h("select", { class: "sv-lane-strategy" });
  const knobs = h("input", { class: "sv-lane-knobs", type: "text", placeholder: "draft_max=4, draft_policy=cost",
    title: "the second lane's knobs, as name=value, separated by commas" });
  const btnCompare = h("button", { class: "sv-btn sv-lane-compare", title: "the same prompt from the start with this setting; both lanes run to their end" }, "Compare from the start");
  const btnApply = h("button", { class: "sv-btn sv-lane-apply", title: "the second lane's next rounds use this setting" }, "Apply to B");
  const btnStep = h("button", { class: "sv-btn sv-lane-step", title: "one round of each lane" }, "Step both");
  const btnRun = h("button", { class: "sv-btn sv-lane-run", title: "both lanes to their end" }, "Run both");
  const btnClose = h("button", { class: "sv-btn sv-lane-close", title: "close the second lane" }, "Close B");
  const setting = h("div", { class: "sv-lane-setting" }, h("span", { class: "sv-lbl", text: "lane B" }), strat, knobs, btnCompare, btnApply,
    btnStep, btnRun, btnClose);
  const sub = h("span", { class: "sv-sub sv-lane-sub", text: "branch from a token (click it) or compare another setting from the start" });
  const words = h("ul", { class: "sv-lane-words" });
  const figures = h("table", { class: "sv-kvtable sv-lane-figures" });
  const grid = h("div", { class: "sv-lane-grid" });
  const more = h("div", { class: "sv-muted sv-lane-more" });
  const chartBox = h("div", { class: "sv-chart sv-lane-chart" });
  const chartNote = h("div", { class: "sv-chart-note", hidden: true });
  const legend = h("div", { class: "sv-chart-legend" });
  const body = h("div", { class: "sv-lane-body", hidden: true }, words,
    h("div", { class: "sv-lane-cols" }, h("div", { class: "sv-lane-left" }, figures, legend, chartBox, chartNote), h("div", { class: "sv-lane-right" }, grid, more)));
  const card = h("div", { class: "sv-card sv-lanes-card", "data-lane": "closed" },
    h("div", { class: "sv-card-h" }, h("span", { text: "Compare lanes" }), sub), setting, body);

  let Plotly = null, last = null, lane = { open: false };
  btnCompare.addEventListener("click", () => send(laneSettingMessage("compare", strat.value, knobs.value)));
  btnApply.addEventListener("click", () => send(laneSettingMessage("configure", strat.value, knobs.value)));
  btnStep.addEventListener("click", () => send(laneMessage("step")));
  btnRun.addEventListener("click", () => send(laneMessage("run")));
  btnClose.addEventListener("click", () => send(laneMessage("close")));

  function cellEl(c) {
    if (!c) return h("span", { class: "sv-lane-cell sv-lane-none", text: " " });
    const e = h("span", { class: "sv-lane-cell sv-tok " + tokenClass({ status: c.kind === "kept" ? "kept" : c.kind }) +
      (c.diff ? " sv-lane-diff" : "") + (c.first ? " sv-lane-first" : ""), title: "position " + c.pos + " · round " + c.round + " · " + c.kind,
    text: showPiece(c.piece) });
    e.dataset.pos = c.pos;
    return e;
  }

  function drawChart() {
    if (!Plotly || !last) return;
    const spec = laneOverlaySpec(last, { palette: palette() });
    chartNote.hidden = !spec.note;
    chartBox.hidden = !!spec.note;
    if (spec.note) {
      chartNote.textContent = spec.note;
      return;
    }
    legend.replaceChildren(...spec.legend.map(([sw, text]) => h("span", { class: "sv-lg" }, h("i", { class: "sv-sw " + sw }), h("span", { text }))));
    Plotly.react(chartBox, spec.data, spec.layout, { displayModeBar: false, responsive: false });
  }
  function palette() {
    const cs = getComputedStyle(card);
    const v = (n) => cs.getPropertyValue(n).trim() || undefined;
    return { fg2: v("--sv-fg-2"), grid: v("--sv-grid"), accent: v("--sv-accent"), slate: v("--sv-muted") };
  }

  function update(msg) {
    lane = msg.lane || { open: false };
    last = msg.data || null;
    card.dataset.lane = lane.open ? (lane.running ? "running" : lane.finished ? "finished" : "open") : "closed";
    body.hidden = !last;
    syncButtons();
    if (!last) {
      sub.textContent = "branch from a token (click it) or compare another setting from the start";
      return;
    }
    const A = last.a, B = last.b;
    sub.textContent = "A: " + A.strategy + " (" + knobText(A.knobs) + ") · B: " + B.strategy + " (" + knobText(B.knobs) + ")";
    words.replaceChildren(...(last.words || []).map((w) => h("li", { text: w })));
    figures.replaceChildren(h("tr", null, h("th", { text: "" }), h("th", { text: "A" }), h("th", { text: "B" }), h("th", { text: "B − A" })),
      ...laneFigureRows(last).map((r) => h("tr", null, h("th", { text: r[0] }), ...r.slice(1).map((x) => h("td", { text: x })))));
    const al = alignLanes(last);
    grid.replaceChildren(...al.rows.map((r) => h("div", { class: "sv-lane-row" },
      h("span", { class: "sv-lane-pos", text: String(r.start) }),
      h("div", { class: "sv-lane-pair" }, h("div", { class: "sv-lane-line sv-lane-a" }, h("b", { text: "A" }), ...r.a.map(cellEl)),
        h("div", { class: "sv-lane-line sv-lane-b" }, h("b", { text: "B" }), ...r.b.map(cellEl))))));
    more.textContent = al.total > al.shown ? "first " + al.shown + " of " + al.total + " positions shown" : "";
    grid.dataset.divergence = al.divergence == null ? "" : String(al.divergence);
    drawChart();
  }

  let cfg = {};
  function syncButtons() {
    const busy = !!cfg.running || !!cfg.working, ro = !!cfg.replay || !cfg.can_control;
    btnCompare.disabled = busy || ro || !cfg.strategy;
    btnApply.disabled = busy || ro || !lane.open;
    btnStep.disabled = busy || ro || !lane.open;
    btnRun.disabled = busy || ro || !lane.open;
    btnClose.disabled = busy || !lane.open;
    setting.hidden = ro;
  }
  /** The host's control state: the strategies offered, what is allowed now. */
  function sync(config) {
    cfg = config;
    if (Array.isArray(config.strategies) && strat.options.length !== config.strategies.length) {
      const cur = strat.value || config.strategy;
      strat.replaceChildren(...config.strategies.map((s) => h("option", { value: s, text: s })));
      strat.value = config.strategies.includes(cur) ? cur : config.strategy;
    }
    syncButtons();
  }

  return { card, update, sync, setPlotly: (P) => { Plotly = P; drawChart(); } };
}
