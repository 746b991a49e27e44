// Notices: messages from the host (a refused message, a missing package …) and errors of the page
// itself, shown above the stream until dismissed. The same text arriving again bumps a counter
// instead of stacking; only the newest few are kept.

import { h } from "../dom.js";

const MAX_NOTICES = 4;

/** `{el, show(level, text)}`; `level` is "error", "warning" or "info". */
export function noticesView() {
  const el = h("div", { class: "sv-notices", role: "status", "aria-live": "polite" });

  function show(level, text) {
    const lvl = level === "error" || level === "warning" ? level : "info";
    const msg = String(text == null ? "" : text);
    const top = el.firstElementChild;
    if (top && top.dataset.level === lvl && top.querySelector(".sv-notice-text").textContent === msg) {
      const n = +(top.dataset.count || 1) + 1;
      top.dataset.count = String(n);
      top.querySelector(".sv-notice-count").textContent = "×" + n;
      return;
    }
    const item = h("div", { class: "sv-notice sv-notice-" + lvl, "data-level": lvl },
      h("span", { class: "sv-notice-text", text: msg }), h("span", { class: "sv-notice-count" }),
      h("button", { class: "sv-notice-x", title: "dismiss", "aria-label": "dismiss", onclick: () => item.remove() }, "×"));
    el.prepend(item);
    while (el.childElementCount > MAX_NOTICES) el.lastElementChild.remove();
  }

  return { el, show };
}
