// Token detail: the tooltip shown on hover and the panel under the stream filled on click (for a
// rejected token, the target's top alternatives at that position).

import { h, table } from "../dom.js";
import { fmtP, quote, showPiece } from "../format.js";
import { FORCED_TITLE, tokenClass } from "./token_class.js";

const HINT = "Hover a token for its details; click a rejected token for the target's top alternatives.";
const KIND_TEXT = { prompt: "prompt", accepted: "accepted draft", bonus: "bonus (target)", correction: "correction (target)",
  plain: "target (no draft)", rejected: "rejected draft", kept: "kept (its round was cut by a rewind)" };

/** The rows describing a token: text, id, kind, then its position or round, depth and probabilities. */
export function describeToken(t) {
  const rows = [["text", quote(t.piece)], ["id", String(t.id)], ["kind", KIND_TEXT[t.status]]];
  if (t.status === "prompt") rows.push(["position", String(t.pos)]);
  else rows.push(["round", String(t.round)], ["depth", String(t.depth)], ["draft p", fmtP(t.draftP)], ["target p", fmtP(t.targetP)]);
  if (t.forced) rows.push(["grammar", FORCED_TITLE + " (the only token it allowed here)"]);
  if (t.rejection && t.first) rows.push(["target chose", quote(t.rejection.target_piece) + " (" + fmtP(t.rejection.target_prob) + ")"]);
  if (t.drafter) rows.push(["drafter", t.drafter]);
  if (t.block) {
    rows.push(["block", (t.block.kind || "block") + ": position " + (t.depth + 1) + " of " + t.block.positions + ", drafted in parallel"]);
    const c = t.block.confidence;
    if (Array.isArray(c) && c[t.depth] != null) rows.push(["confidence", fmtP(c[t.depth])]);
  }
  return rows;
}

/**
 * `{panel, tip, hover(token, el), hideTip(), select(token), clear()}`; `tip` belongs at the root's end.
 * `actions(token)`, when given, returns elements shown under a selected token (the workbench's rewind
 * and branch buttons).
 */
export function detailView(actions) {
  const panel = h("div", { class: "sv-detail" });
  const tip = h("div", { class: "sv-tip", hidden: true });

  function clear() {
    panel.replaceChildren(h("span", { class: "sv-muted", text: HINT }));
  }

  function hover(t, el) {
    tip.replaceChildren(table(describeToken(t)));
    tip.hidden = false;
    const r = el.getBoundingClientRect();
    tip.style.left = Math.max(4, Math.min(window.innerWidth - 260, r.left)) + "px";
    tip.style.top = (r.bottom + 6) + "px";
  }

  function select(t) {
    const where = t.status === "prompt" ? " prompt token " + t.pos : " round " + t.round + " · depth " + t.depth;
    const parts = [h("div", { class: "sv-detail-h" }, h("span", { class: "sv-tok " + tokenClass(t), text: showPiece(t.piece) }),
      h("span", { class: "sv-muted", text: where })), table(describeToken(t))];
    if (t.rejection) parts.push(alternatives(t.rejection));
    const extra = actions ? actions(t) : null;
    if (extra) parts.splice(1, 0, extra);
    panel.replaceChildren(...parts);
  }

  clear();
  return { panel, tip, hover, hideTip: () => { tip.hidden = true; }, select, clear };
}

// The target's top choices where it refused the draft: the chosen and the drafted token marked.
function alternatives(rej) {
  const alts = rej.alternatives || [];
  const box = h("div", { class: "sv-alts" },
    h("div", { class: "sv-alts-h", text: "Target's top alternatives at round " + rej.round + ", depth " + rej.depth +
      " (draft proposed " + quote((rej.pieces || [])[0]) + ")" }));
  const maxp = Math.max(1e-9, ...alts.map((a) => a.prob || 0));
  for (const a of alts) {
    const chosen = a.token === rej.target_token;
    const drafted = a.token === (rej.tokens || [])[0];
    box.append(h("div", { class: "sv-alt" + (chosen ? " sv-alt-chosen" : "") + (drafted ? " sv-alt-drafted" : "") },
      h("span", { class: "sv-alt-piece", text: showPiece(a.piece) }),
      h("span", { class: "sv-alt-bar" }, h("span", { style: "width:" + (100 * (a.prob || 0) / maxp).toFixed(1) + "%" })),
      h("span", { class: "sv-alt-p", text: fmtP(a.prob) }),
      h("span", { class: "sv-alt-id", text: "#" + a.token + (chosen ? " · chosen" : "") + (drafted ? " · drafted" : "") })));
  }
  if (!alts.length) box.append(h("div", { class: "sv-muted", text: "no alternatives recorded" }));
  return box;
}
