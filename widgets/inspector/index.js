// specviz inspector — one front-end module for both hosts (the entry of the assembled module).
//
// anywidget (JupyterLab):  render({model, el}) with model.send / model.on("msg:custom")
// Panel JSComponent:       render({model, el}) with model.send_msg / model.on("msg:custom")
//
// The messages are declared in protocol.json (built by messages.js, read by protocol.js). This file wires the parts together: the state
// (state.js: reduce(state, event)), the views (views/*.js) and the host (host.js). Python assembles
// this file and everything it imports into the one ES module both hosts load (specviz/ui/bundle.py).

import { h } from "./dom.js";
import { hostOf } from "./host.js";
import { fetchPlotly, getPlotly, installPlotly } from "./plotly.js";
import { helloMessage, rewindToRound } from "./messages.js";
import { planEvents, stateIsStale, unpackMessages } from "./protocol.js";
import { seqAt } from "./seq.js";
import { initialState, reduce } from "./state.js";
import { adviceView } from "./views/advice.js";
import { audienceView } from "./views/audience.js";
import { batchView } from "./views/batch.js";
import { chartsView } from "./views/charts.js";
import { controlsView } from "./views/controls.js";
import { detailView } from "./views/detail.js";
import { diagnosisView } from "./views/diagnosis.js";
import { filesView } from "./views/files.js";
import { headerView } from "./views/header.js";
import { lanesView } from "./views/lanes.js";
import { noticesView } from "./views/notices.js";
import { presetsView } from "./views/presets.js";
import { rewindActions } from "./views/rewind_actions.js";
import { statsView } from "./views/stats.js";
import { streamView } from "./views/stream.js";
import { treeView } from "./views/tree.js";

/** Render an inspector into `el`; returns the cleanup function (also run when `el` is rendered again). */
function render({ model, el }) {
  if (el.__specvizCleanup) el.__specvizCleanup(); // a host may render the same element again
  const host = hostOf(model);
  const uid = Math.random().toString(36).slice(2, 9);
  let S = initialState();
  let destroyed = false;
  const getState = () => S;

  const root = h("div", { class: "specviz-inspector" });
  const header = headerView();
  const notices = noticesView();
  const audience = audienceView();
  const send = (m) => host.send(m);
  const controls = controlsView(send, root, uid);
  const detail = detailView(rewindActions(send, () => controls.config));
  const stream = streamView(detail, getState);
  const stats = statsView();
  const charts = chartsView(root, getState, () => controls.config);
  // the debugging workbench: presets, files, comparison lanes, diagnosis and advice
  const presets = presetsView(send);
  const files = filesView(send, notices);
  const lanes = lanesView(send);
  const diagnosis = diagnosisView(send);
  const advice = adviceView(send);
  const batch = batchView(root); // a batched run's lanes: shown only when the stream holds batch steps
  const tree = treeView(); // a round's draft tree: shown only when the stream holds tree rounds
  stream.el.addEventListener("click", (e) => { // a token of a round: the tree card shows that round
    const s = e.target.closest ? e.target.closest(".sv-tok[data-i]") : null;
    const t = s ? seqAt(S.tokens, +s.dataset.i) : null;
    if (t && t.status !== "prompt") tree.show(t.round);
  });
  controls.toolbar.append(files.el);
  charts.kv.onPoint = (pt) => {
    const c = controls.config;
    if (!c.replay && c.can_control && !c.running && Number.isInteger(pt.x)) send(rewindToRound(pt.x));
  };
  root.append(header.el, audience.el, controls.toolbar, presets.el, notices.el,
    h("div", { class: "sv-top" }, stream.card, h("div", { class: "sv-side" }, stats.el, controls.card)),
    tree.card, batch.card, lanes.card, h("div", { class: "sv-workbench" }, diagnosis.card, advice.card), charts.el, detail.tip);
  el.append(root);
  if (document.body && document.body.dataset && document.body.dataset.jpThemeLight === "false") root.classList.add("sv-dark");

  // ---- events: reduce, then let each view render what the event added
  function hello() {
    host.send(helloMessage(S));
  }

  function applyEvents(msg) {
    const plan = planEvents(S, msg);
    if (plan.error) {
      notices.show("error", plan.error);
      return;
    }
    if (plan.ask) { // a gap, or a new epoch that does not start at 0: ask for what is missing
      hello();
      return;
    }
    const before = S;
    if (plan.reset) {
      S = initialState(msg.epoch);
      stream.clear();
    }
    for (const ev of plan.events) {
      const prev = S;
      S = reduce(S, ev);
      if (!ev || typeof ev !== "object") continue;
      stream.event(ev, S, prev);
      header.event(ev, S);
      charts.kv.event(ev);
      controls.event(ev);
    }
    if (plan.reset || S.rounds !== before.rounds || S.started !== before.started) {
      stats.update(S);
      charts.schedule();
    }
    root.dataset.events = String(S.n);
    root.dataset.rounds = String(S.rounds.length);
    if (plan.reset || S.batch !== before.batch) batch.update(S);
    if (plan.reset || S.trees !== before.trees) tree.update(S);
    stream.batchDone(S);
  }

  // ---- messages from the host
  const appendMs = []; // how long each events message took to apply, in ms (see the hooks below)
  let lastStateSeq = -1; // the newest state's seq (see "state" below)
  function onMsg(msg) {
    if (destroyed || !msg || typeof msg !== "object") return;
    try {
      switch (msg.type) {
        case "events": {
          const t0 = performance.now();
          applyEvents(msg);
          appendMs.push(performance.now() - t0); // for the load benchmark (the newest 4096)
          if (appendMs.length > 4096) appendMs.splice(0, appendMs.length - 4096);
          break;
        }
        case "state":
          // a state older than one already applied (the host may deliver a queued message late) is dropped
          if (stateIsStale(lastStateSeq, msg)) break;
          if (typeof msg.seq === "number") lastStateSeq = msg.seq;
          if (controls.applyState(msg)) charts.mark("conf");
          header.status(controls.config);
          audience.apply(msg);
          lanes.sync(controls.config);
          files.sync(controls.config);
          presets.sync(controls.config);
          break;
        case "comparison": lanes.update(msg); break;
        case "diagnosis": diagnosis.update(msg.data); break;
        case "advice": advice.update(msg.data); break;
        case "presets": presets.update(msg); break;
        case "download": files.download(msg); break;
        case "upload": files.uploaded(msg); break;
        case "knob_errors": controls.knobErrors(msg); break;
        case "schema": controls.schema(msg); break;
        case "plotly":
          try {
            if (typeof msg.url === "string") {
              fetchPlotly(msg.url).catch((e) => notices.show("error", "could not load plotly: " + e));
            } else {
              installPlotly(msg.source);
            }
          } catch (e) {
            console.error("specviz: could not load plotly", e);
            notices.show("error", "could not load plotly: " + e);
          }
          break;
        case "notice": notices.show(msg.level, msg.text); break;
        case "packed": {
          const u = unpackMessages(msg);
          if (u.error) notices.show("error", u.error);
          else for (const m of u.messages) onMsg(m);
          break;
        }
        default: break;
      }
    } catch (e) { // keep the page alive and say what happened
      console.error("specviz: could not handle a message", msg, e);
      notices.show("error", "the page could not handle a " + JSON.stringify(String(msg.type)) + " message: " + e);
    }
  }
  host.on(onMsg);
  hello();
  getPlotly(host).then((P) => {
    if (!destroyed) {
      charts.setPlotly(P);
      lanes.setPlotly(P);
      batch.setPlotly(P);
      advice.setPlotly(P);
    }
  });

  // test/benchmark hooks (no effect on the widget itself)
  root.__specviz = {
    get state() { return S; },
    apply: onMsg,
    send: (m) => host.send(m),
    drawCharts: (staggered) => charts.drawAll(staggered),
    drawChart: (key) => charts.drawOne(key),
    charts: charts.keys,
    appendMs, // main-thread ms per events message (benchmarks/bench_serve_load.py)
  };

  const cleanup = () => {
    destroyed = true;
    host.off(onMsg);
    charts.destroy();
    root.remove();
    el.__specvizCleanup = null;
  };
  el.__specvizCleanup = cleanup;
  return cleanup;
}

export { render };
export default { render };
