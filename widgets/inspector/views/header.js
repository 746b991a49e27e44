// The header: title, the model (and draft model) pill, the strategy pill and the status pill.

import { MODEL_DRAFTERS } from "../chart_specs.js";
import { h } from "../dom.js";
import { basename } from "../format.js";

/** `{el, event(ev, state), status(config)}`. */
export function headerView() {
  const title = h("div", { class: "sv-title" }, h("span", { class: "sv-logo", text: "◆" }), h("span", { text: "specviz" }));
  const modelPill = h("span", { class: "sv-pill sv-pill-model", text: "no session" });
  const strategyPill = h("span", { class: "sv-pill sv-pill-strategy", text: "" });
  const statusPill = h("span", { class: "sv-pill sv-status", text: "idle" });
  // a chat request: the prompt tokens in the stream are what the chat template produced
  const requestPill = h("span", { class: "sv-pill sv-pill-request", hidden: true });
  const el = h("div", { class: "sv-header" }, title, modelPill, strategyPill, requestPill, h("span", { class: "sv-grow" }), statusPill);

  function event(ev, state) {
    if (ev.kind === "session_started") {
      modelPill.textContent = basename(ev.model) + (ev.draft_model ? " + " + basename(ev.draft_model) : "");
      strategyPill.textContent = ev.strategy;
      const parts = [];
      if (ev.chat_template) parts.push("chat · " + (ev.chat_template === "model" ? "the model's template" : ev.chat_template + " template"));
      if (ev.stop && ev.stop.length) parts.push("stop " + ev.stop.map((x) => JSON.stringify(x)).join(" "));
      requestPill.textContent = parts.join(" · ");
      requestPill.hidden = !parts.length;
      requestPill.title = ev.chat_template ? "the prompt tokens shown are what the chat template produced from the messages" : "";
    } else if (ev.kind === "knobs_changed") {
      strategyPill.textContent = ev.strategy;
      if (state.started) {
        const dm = MODEL_DRAFTERS.includes(ev.strategy) && ev.knobs ? ev.knobs.draft_model : null;
        modelPill.textContent = basename(state.started.model) + (dm ? " + " + basename(dm) : "");
      }
    }
  }

  function status(c) {
    // "working": a served page's heavy message (a reset, a lane branch, advice …) runs in the background
    statusPill.textContent = c.working ? "working · " + c.working : c.replay ? (c.running ? "replaying" : "replay")
      : c.running ? "running" : c.finished ? "finished · " + c.finished : c.can_step ? "ready" : "idle";
    statusPill.className = "sv-pill sv-status" + (c.working ? " sv-st-work" : c.running ? " sv-st-run" : c.finished ? " sv-st-done" : "");
  }

  return { el, event, status };
}
