// The KV cache timeline card: per round, each context's cache length before the verify batch → its
// peak → after the rollback (the spec is chart_specs.js "kv"), and the model's sliding window if any.

import { KV_ROUNDS } from "../chart_specs.js";
import { h } from "../dom.js";
import { chartCard } from "./chart_card.js";

/** The KV card (see chartCard) with `event(ev)`: a new session names its sliding window. */
export function kvTimelineCard() {
  const c = chartCard("kv", "sv-kv", "KV cache timeline",
    "per round: length before the verify → peak → after the rollback, last " + KV_ROUNDS + " rounds",
    [["sv-sw-tc", "target: committed"], ["sv-sw-tr", "target: rolled back"]]);
  const swa = h("span", { class: "sv-sub sv-swa", text: "" });
  c.head.append(swa);
  c.event = (ev) => {
    if (ev.kind === "session_started") swa.textContent = ev.n_swa > 0 ? "sliding window " + ev.n_swa : "";
  };
  return c;
}
