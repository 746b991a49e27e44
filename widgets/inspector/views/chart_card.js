// A chart card: a title and subtitle, an HTML legend (cheaper and more legible than plotly's), the
// plot box, and a note shown in place of the plot when the chart has nothing to show.

import { h } from "../dom.js";

/** `{key, box, note, card, head, subEl, shown, legend(items), show(yes, text)}`. */
export function chartCard(key, cls, label, sub, legendItems) {
  const box = h("div", { class: "sv-chart " + cls }, h("div", { class: "sv-chart-loading", text: "loading charts…" }));
  const note = h("div", { class: "sv-chart-note", hidden: true });
  const legendEl = h("div", { class: "sv-chart-legend" });
  const subEl = h("span", { class: "sv-sub", text: sub || "" });
  const head = h("div", { class: "sv-card-h" }, h("span", { text: label }), subEl);
  const card = h("div", { class: "sv-card sv-chart-card", "data-chart": key }, head, legendEl, box, note);
  const c = { key, box, note, card, head, subEl, shown: true, legendSig: null };
  c.legend = (items) => legendEl.replaceChildren(...items.map(([swatch, text]) =>
    h("span", { class: "sv-lg" }, h("i", { class: "sv-sw " + swatch }), h("span", { text }))));
  c.show = (yes, text) => {
    c.shown = yes;
    box.hidden = !yes;
    note.hidden = yes;
    if (!yes) note.textContent = text || "";
    card.classList.toggle("sv-chart-empty", !yes);
  };
  c.legend(legendItems || []);
  return c;
}
