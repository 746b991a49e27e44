// The draft tree of one round (issue 56): the pending token on the left, each drafted node in a column per
// depth and a row per branch with its token and draft probability, the accepted path in the accept colour,
// the nodes the target refused in the reject colour, the nodes never reached grey, and above them the
// target's choice at each depth (hover for its alternatives). The card shows only once the stream holds a
// tree round; it follows the newest tree round until another is picked (its slider, or a click on a token of
// the stream, `show(round)`); a picked chain round says its draft is the stream's chain.

import { h, table } from "../dom.js";
import { fmtP, quote, showPiece } from "../format.js";
import { seqAt, seqSlice } from "../seq.js";
import { TREE_GEOMETRY, treeLayout, treeSummary } from "../tree_specs.js";

const SVG = "http://www.w3.org/2000/svg";
const FATE = { accepted: "sv-acc", rejected: "sv-rej", unreached: "sv-tree-unreached" };
const FATE_TEXT = { accepted: "accepted (on the accepted path)", rejected: "rejected: the target chose another token here",
  unreached: "never reached: below a rejected node" };
const CHOICE_CLASS = { match: "sv-acc", bonus: "sv-bonus", correction: "sv-corr" };
const CHOICE_TEXT = { match: "the target's choice: the path goes on", bonus: "the target's bonus token (the whole branch accepted)",
  correction: "the target's correction (it refused every drafted child)" };

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

/** The rows describing node `nd` of tree `tr`. */
export function describeNode(tr, nd) {
  const rows = [["text", quote(nd.piece)], ["id", String(nd.token)], ["depth", String(nd.depth)], ["draft p", fmtP(nd.prob)],
    ["fate", FATE_TEXT[nd.status]]];
  const choice = tr.choices[nd.depth - 1];
  if (nd.status === "rejected" && choice) rows.push(["target chose", quote(choice.piece) + " (" + fmtP(choice.prob) + ")"]);
  rows.push(["node", "#" + nd.i + (nd.parent < 0 ? " (a child of the pending token)" : " (child of #" + nd.parent + ")")]);
  return rows;
}

/** The target's choice at one depth and its alternatives (the row's next most probable tokens), the chosen and the
 * drafted tokens marked. */
export function choiceAlternatives(c) {
  const box = h("div", { class: "sv-tree-alts" }, h("div", { class: "sv-alts-h", text: "Target at depth " + c.depth + ": " +
    quote(c.piece) + " (" + fmtP(c.prob) + ")" }), h("div", { class: "sv-muted", text: CHOICE_TEXT[c.kind] || "" }));
  const own = { token: c.token, piece: c.piece, prob: c.prob };
  const alts = c.alternatives.some((a) => a.token === c.token) ? c.alternatives : [own, ...c.alternatives];
  for (const a of alts) {
    const chosen = a.token === c.token, drafted = c.drafted.includes(a.token);
    box.append(h("div", { class: "sv-tree-alt" + (chosen ? " sv-alt-chosen" : "") + (drafted ? " sv-alt-drafted" : ""),
      "data-token": String(a.token) },
    h("span", { class: "sv-alt-piece", text: showPiece(a.piece) }), h("span", { class: "sv-alt-p", text: fmtP(a.prob) }),
    h("span", { class: "sv-alt-id", text: "#" + a.token + (chosen ? " · chosen" : "") + (drafted ? " · drafted" : "") })));
  }
  return box;
}

/** `{card, update(state), show(round)}`. */
export function treeView() {
  const sub = h("span", { class: "sv-sub sv-tree-sub" });
  const slider = h("input", { class: "sv-tree-slider", type: "range", min: "0", max: "0", value: "0", title: "the tree round shown" });
  const roundText = h("span", { class: "sv-tree-roundtext" });
  const canvas = h("div", { class: "sv-tree-canvas" });
  const note = h("div", { class: "sv-tree-note sv-muted", hidden: true });
  const tip = h("div", { class: "sv-tree-tip", hidden: true });
  const legend = h("div", { class: "sv-chart-legend sv-tree-legend" },
    ...[["acc", "accepted path"], ["rej", "rejected by the target"], ["unreached", "never reached"],
      ["choice", "target's choice (hover: alternatives)"]].map(([c, t]) => h("span", { class: "sv-lg" },
      h("i", { class: "sv-tree-sw sv-tree-sw-" + c }), h("span", { text: t }))));
  const card = h("div", { class: "sv-card sv-tree-card", hidden: true },
    h("div", { class: "sv-card-h" }, h("span", { text: "Draft tree" }), sub),
    h("div", { class: "sv-tree-nav" }, h("span", { class: "sv-lbl", text: "round" }), slider, roundText),
    legend, h("div", { class: "sv-tree-scroll" }, canvas), note, tip);

  let state = null, trees = null, want = null, picked = null; // picked: a round number chosen from the stream

  slider.addEventListener("input", () => {
    const i = Number(slider.value);
    want = trees && i >= trees.length - 1 ? null : i; // at the end: follow the newest tree round again
    picked = null;
    draw();
  });

  function hover(rows, el, extra) {
    tip.replaceChildren(table(rows));
    if (extra) tip.append(extra);
    tip.hidden = false;
    const r = el.getBoundingClientRect();
    tip.style.left = Math.max(4, Math.min(window.innerWidth - 330, r.left)) + "px";
    tip.style.top = (r.bottom + 6) + "px";
  }
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });

  function nodeEl(tr, nd, box, g) {
    const e = h("div", { class: "sv-tree-node sv-tok " + FATE[nd.status], "data-node": String(nd.i), "data-status": nd.status,
      "data-depth": String(nd.depth), "data-token": String(nd.token),
      style: "left:" + box.x + "px;top:" + box.y + "px;width:" + g.nodeW + "px;height:" + g.nodeH + "px" },
    h("span", { class: "sv-tree-piece", text: showPiece(nd.piece) }), h("span", { class: "sv-tree-p", text: fmtP(nd.prob) }));
    e.addEventListener("mouseenter", () => hover(describeNode(tr, nd), e));
    return e;
  }

  function choiceEl(c, box, g) {
    const e = h("div", { class: "sv-tree-choice sv-tok " + (CHOICE_CLASS[c.kind] || "sv-corr"), "data-depth": String(c.depth),
      "data-kind": c.kind, "data-token": String(c.token),
      style: "left:" + box.x + "px;top:" + box.y + "px;width:" + g.nodeW + "px;height:" + g.nodeH + "px" },
    h("span", { class: "sv-tree-piece", text: showPiece(c.piece) }), h("span", { class: "sv-tree-p", text: fmtP(c.prob) }));
    e.addEventListener("mouseenter", () => hover([["target", quote(c.piece)], ["id", String(c.token)], ["target p", fmtP(c.prob)]],
      e, choiceAlternatives(c)));
    return e;
  }

  function drawTree(tr) {
    const g = TREE_GEOMETRY, L = treeLayout(tr, g);
    canvas.style.width = L.width + "px";
    canvas.style.height = L.height + "px";
    const lines = svg("svg", { class: "sv-tree-edges", width: L.width, height: L.height, viewBox: "0 0 " + L.width + " " + L.height });
    for (const ed of L.edges) lines.append(svg("path", { d: ed.d, class: "sv-tree-edge sv-tree-edge-" + ed.status }));
    const pend = tr.pending;
    const root = h("div", { class: "sv-tree-node sv-tree-root sv-tok sv-plain", "data-node": "root",
      style: "left:" + L.root.x + "px;top:" + L.root.y + "px;width:" + g.nodeW + "px;height:" + g.nodeH + "px",
      title: "the pending token (row 0 of the verify batch, in every branch's sequence)" },
    h("span", { class: "sv-tree-piece", text: pend ? showPiece(pend.piece) : "pending" }));
    const laneLbl = h("div", { class: "sv-tree-lanelbl sv-muted", text: "target chose",
      style: "left:" + L.root.x + "px;top:" + (g.pad + 5) + "px" });
    canvas.replaceChildren(lines, laneLbl, root, ...tr.nodes.map((nd) => nodeEl(tr, nd, L.boxes[nd.i], g)),
      ...tr.choices.map((c, k) => choiceEl(c, L.choices[k], g)));
  }

  // The round shown and its index among the tree rounds (-1 for a picked chain round).
  function shownRound() {
    if (picked != null) {
      const r = state ? seqSlice(state.rounds).find((x) => x.round === picked) : null;
      if (r) return [r, seqSlice(trees).indexOf(r)];
      picked = null;
    }
    const i = want == null || want >= trees.length ? trees.length - 1 : want;
    return [seqAt(trees, i), i];
  }

  function draw() {
    tip.hidden = true;
    if (!trees || !trees.length) return;
    const [r, k] = shownRound();
    slider.max = String(Math.max(0, trees.length - 1));
    slider.value = String(k >= 0 ? k : trees.length - 1);
    card.dataset.round = String(r.round);
    card.dataset.kind = r.tree ? "tree" : "chain";
    note.hidden = !!r.tree;
    canvas.hidden = !r.tree;
    if (!r.tree) {
      roundText.textContent = "round " + r.round;
      note.textContent = "Round " + r.round + " drafted a chain of " + r.drafted + " token" + (r.drafted === 1 ? "" : "s") +
        " (" + r.accepted + " accepted): the token stream shows it.";
      canvas.replaceChildren();
      return;
    }
    roundText.textContent = "round " + r.round + " · " + treeSummary(r.tree);
    card.dataset.nodes = String(r.tree.nodes.length);
    card.dataset.path = r.tree.path.join(",");
    drawTree(r.tree);
  }

  /** The state after an events message: shown once it holds a tree round; redrawn when its tree rounds change. */
  function update(s) {
    state = s;
    const t = s.trees;
    card.hidden = !t || !t.length;
    if (t === trees) return;
    trees = t;
    const tt = s.tel && s.tel.tree; // the session's own count (telemetry), beside the rounds this view holds
    sub.textContent = t.length + " tree round" + (t.length === 1 ? "" : "s") +
      (tt && tt.nodes_verified ? " · up to " + tt.max_branches + " branches · " + tt.nodes_verified + " nodes verified" : "");
    card.dataset.trees = String(t.length);
    draw();
  }

  /** Show round `round` (a token of it was clicked in the stream): its tree, or the note that it drafted a chain. */
  function show(round) {
    if (!trees || !trees.length || !Number.isInteger(round)) return;
    picked = round;
    draw();
  }

  return { card, update, show };
}
