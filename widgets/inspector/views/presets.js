// Presets: named starting points (a prompt, a strategy and its knobs) one click away; Python starts them.

import { h } from "../dom.js";
import { presetMessage } from "../messages.js";

/** `{el, update(msg), sync(config)}`; `send(msg)` goes to the host. */
export function presetsView(send) {
  const list = h("span", { class: "sv-preset-list" });
  const el = h("div", { class: "sv-presets", hidden: true }, h("span", { class: "sv-lbl", text: "presets" }), list);
  let buttons = [];

  function update(msg) {
    const ps = Array.isArray(msg.presets) ? msg.presets : [];
    buttons = ps.map((p) => {
      const b = h("button", { class: "sv-btn sv-preset", "data-preset": p.name, title: p.description || p.title }, p.title || p.name);
      b.addEventListener("click", () => send(presetMessage(p.name)));
      return b;
    });
    list.replaceChildren(...buttons);
    el.hidden = !ps.length;
  }

  function sync(config) {
    for (const b of buttons) b.disabled = !!config.running || !!config.working || !!config.replay || !config.can_control;
  }

  return { el, update, sync };
}
