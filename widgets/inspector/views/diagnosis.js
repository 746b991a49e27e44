// The diagnosis panel: why acceptance is what it is (computed in Python: specviz.diagnose) — findings in
// words with their thresholds, acceptance by token class, draft depth, draft confidence and copied spans,
// near misses and the most frequent (drafted → chosen) pairs.

import { h } from "../dom.js";
import { quote } from "../format.js";
import { diagnoseMessage } from "../messages.js";

const pct = (x) => (x == null ? "—" : (100 * x).toFixed(0) + "%");

// A table of groups `{label: {examined, accepted, acceptance}}` with a bar per row.
function rateTable(cls, title, rows) {
  return h("div", { class: "sv-diag-block " + cls }, h("div", { class: "sv-diag-h", text: title }),
    h("table", { class: "sv-diag-table" }, ...rows.map(([label, g]) => h("tr", null, h("th", { text: label }),
      h("td", { class: "sv-diag-bar" }, h("span", { style: "width:" + (100 * (g.acceptance || 0)).toFixed(0) + "%" })),
      h("td", { class: "sv-diag-v", text: pct(g.acceptance) }), h("td", { class: "sv-muted", text: "of " + g.examined })))));
}

/** `{card, update(data)}`; `send(msg)` goes to the host (the Diagnose button). */
export function diagnosisView(send) {
  const btn = h("button", { class: "sv-btn sv-diagnose", title: "diagnose the rounds so far" }, "Diagnose");
  const sub = h("span", { class: "sv-sub", text: "why acceptance is what it is" });
  const body = h("div", { class: "sv-diag-body" }, h("div", { class: "sv-muted", text: "Press Diagnose (or finish the generation)." }));
  const card = h("div", { class: "sv-card sv-diag-card" }, h("div", { class: "sv-card-h" }, h("span", { text: "Diagnosis" }), sub, btn), body);
  btn.addEventListener("click", () => send(diagnoseMessage()));

  function update(d) {
    if (!d) return;
    sub.textContent = d.examined + " draft tokens examined, " + pct(d.acceptance) + " accepted, " + d.rejections + " rejections";
    const findings = h("ul", { class: "sv-findings" }, ...(d.findings.length ? d.findings : [{ text: "nothing stands out", key: "none" }])
      .map((f) => h("li", { "data-key": f.key, text: f.text })));
    const blocks = [];
    blocks.push(rateTable("sv-diag-class", "by token class", Object.entries(d.by_class || {})));
    blocks.push(rateTable("sv-diag-depth", "by draft depth", (d.by_depth || []).map((r) => ["depth " + (r.depth + 1), r])));
    if ((d.by_confidence || []).length) {
      blocks.push(rateTable("sv-diag-conf", "by draft confidence", d.by_confidence.map((r) => ["[" + r.lo.toFixed(1) + ", " + r.hi.toFixed(1) + ")", r])));
    }
    blocks.push(rateTable("sv-diag-copied", "copied spans", Object.entries(d.copied || {})));
    const med = d.medians || {};
    const rej = h("div", { class: "sv-diag-block sv-diag-rej" }, h("div", { class: "sv-diag-h", text: "rejections" }),
      h("div", { text: "near misses (drafted token in the target's top " + d.near_miss_k + "): " + pct(d.near_miss_share) }),
      h("div", { class: "sv-muted", text: "median: target p " + (med.target_prob == null ? "—" : med.target_prob.toFixed(3)) +
        ", rank " + (med.target_rank == null ? "—" : med.target_rank) + ", top-two margin " + (med.margin == null ? "—" : med.margin.toFixed(2)) +
        ", draft p " + (med.draft_prob == null ? "—" : med.draft_prob.toFixed(2)) }),
      h("ol", { class: "sv-diag-pairs" }, ...(d.top_pairs || []).slice(0, 6).map((p) => h("li", null,
        h("span", { text: quote(p.drafted_piece) + " → " + quote(p.chosen_piece) }), h("span", { class: "sv-muted", text: " ×" + p.count })))));
    blocks.push(rej);
    body.replaceChildren(findings, h("div", { class: "sv-diag-grid" }, ...blocks));
    card.dataset.findings = String(d.findings.length);
  }

  return { card, update };
}
