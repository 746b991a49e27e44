// The Draft tree card's DOM (views/tree.js) on a minimal fake DOM: hidden without tree rounds, the newest tree
// round drawn (a node per drafted token with its fate's class, an edge per node, the target's choices), the
// slider and a picked round, a chain round's note, and the hover tips (a node's fate, a choice's alternatives).
import assert from "node:assert/strict";
import test from "node:test";

import { initialState, reduceAll } from "../inspector/state.js";
import { treeView } from "../inspector/views/tree.js";
import { byClass, findAll, installFakeDom } from "./fake_dom.js";
import { started } from "./events.js";
import { treeSession } from "./tree_events.js";

installFakeDom();

const nodes = (card) => findAll(card, (e) => e.classList.contains("sv-tree-node") && e.getAttribute("data-status") != null);
const attrs = (els, name) => els.map((e) => e.getAttribute(name));

test("the card hides without tree rounds and draws the newest tree round", () => {
  const v = treeView();
  v.update(reduceAll(initialState(0), [started()]));
  assert.equal(v.card.hidden, true);
  v.update(reduceAll(initialState(0), treeSession()));
  assert.equal(v.card.hidden, false);
  assert.equal(v.card.dataset.trees, "2");
  assert.equal(byClass(v.card, "sv-tree-sub")[0].textContent, "2 tree rounds · up to 3 branches · 18 nodes verified");
  assert.equal(v.card.dataset.round, "3");
  assert.equal(v.card.dataset.kind, "tree");
  const ns = nodes(v.card);
  assert.deepEqual(attrs(ns, "data-status"), ["rejected", "unreached", "unreached", "unreached", "unreached", "rejected"]);
  assert.deepEqual(attrs(ns, "data-token"), ["40", "41", "42", "43", "44", "45"]);
  assert.ok(ns[0].classList.contains("sv-rej") && ns[1].classList.contains("sv-tree-unreached"));
  assert.equal(ns[0].textContent, "a0.900"); // its token and its draft probability
  assert.equal(byClass(v.card, "sv-tree-edge").length, 6);
  assert.equal(byClass(v.card, "sv-tree-edge")[0].namespace, "http://www.w3.org/2000/svg");
  const choices = byClass(v.card, "sv-tree-choice");
  assert.deepEqual(attrs(choices, "data-kind"), ["correction"]);
  assert.equal(byClass(v.card, "sv-tree-root")[0].textContent, "p62"); // the pending token: round 2's last
});

test("the slider shows an earlier tree round: its accepted path, refused and unreached nodes, the target's choices", () => {
  const v = treeView();
  v.update(reduceAll(initialState(0), treeSession()));
  const slider = byClass(v.card, "sv-tree-slider")[0];
  assert.equal(slider.max, "1");
  slider.value = "0";
  slider.dispatch("input");
  assert.equal(v.card.dataset.round, "1");
  assert.equal(v.card.dataset.path, "0,3");
  assert.deepEqual(attrs(nodes(v.card), "data-status"), ["accepted", "rejected", "unreached", "accepted", "rejected", "rejected"]);
  assert.equal(byClass(v.card, "sv-tree-edge-accepted").length, 2);
  assert.deepEqual(attrs(byClass(v.card, "sv-tree-choice"), "data-kind"), ["match", "match", "correction"]);
  assert.deepEqual(attrs(byClass(v.card, "sv-tree-choice"), "data-depth"), ["1", "2", "3"]);
});

test("hovering a choice lists the target's alternatives, the chosen and the drafted marked; a node gives its fate", () => {
  const v = treeView();
  v.update(reduceAll(initialState(0), treeSession()));
  v.show(1);
  const tip = byClass(v.card, "sv-tree-tip")[0];
  assert.equal(tip.hidden, true);
  const last = byClass(v.card, "sv-tree-choice")[2];
  last.dispatch("mouseenter");
  assert.equal(tip.hidden, false);
  const alts = byClass(tip, "sv-tree-alt");
  assert.deepEqual(attrs(alts, "data-token"), ["50", "44", "9"]);
  assert.ok(alts[0].classList.contains("sv-alt-chosen") && alts[1].classList.contains("sv-alt-drafted"));
  assert.match(alts[1].textContent, /drafted/);
  nodes(v.card)[4].dispatch("mouseenter");
  assert.match(tip.textContent, /rejected: the target chose another token/);
  assert.match(tip.textContent, /target chose“p50”/);
});

test("a picked chain round says its draft is the stream's chain; a tree round picked again draws its tree", () => {
  const v = treeView();
  v.update(reduceAll(initialState(0), treeSession()));
  v.show(2);
  assert.equal(v.card.dataset.kind, "chain");
  assert.equal(v.card.dataset.round, "2");
  const note = byClass(v.card, "sv-tree-note")[0];
  assert.equal(note.hidden, false);
  assert.match(note.textContent, /Round 2 drafted a chain of 2 tokens \(1 accepted\)/);
  assert.equal(nodes(v.card).length, 0);
  v.show(1);
  assert.equal(v.card.dataset.kind, "tree");
  assert.equal(note.hidden, true);
  assert.equal(nodes(v.card).length, 6);
  v.show(99); // a round the state does not hold: the newest tree round
  assert.equal(v.card.dataset.round, "3");
});
