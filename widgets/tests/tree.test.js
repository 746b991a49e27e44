// Draft trees in the inspector (issue 56): the reducer keeps each tree round's nodes with their fates and
// places and the target's choices, a chain round keeps no tree, a rewind drops the later tree rounds; the
// layout puts a column per depth and a row per branch. No DOM (views/tree.js is checked in a browser).
import assert from "node:assert/strict";
import test from "node:test";

import { seqSlice } from "../inspector/seq.js";
import { initialState, reduce, reduceAll } from "../inspector/state.js";
import { TREE_GEOMETRY, TREE_ROOT, treeBranches, treeLayout, treeRound, treeSummary } from "../inspector/tree_specs.js";
import { accepted, drafted, rewound, started, telemetry, verified } from "./events.js";
import { TREE, treeSession } from "./tree_events.js";

const fates = (tr) => tr.nodes.map((n) => n.status[0]).join("");

test("a tree round keeps its nodes' fates: the accepted path, the refused children along it, the nodes never reached", () => {
  const s = reduceAll(initialState(0), treeSession());
  const rs = seqSlice(s.rounds);
  assert.equal(rs.length, 3);
  const tr = rs[0].tree;
  assert.deepEqual(tr.path, [0, 3]);
  // 40 and 43 accepted; 41 (a sibling of 43), 44 (the last accepted node's child) and 45 (the root's) rejected; 42 under 41 unreached
  assert.equal(fates(tr), "aruarr");
  assert.deepEqual([tr.nAccepted, tr.nRejected, tr.nUnreached], [2, 3, 1]);
  assert.deepEqual(tr.nodes.map((n) => n.depth), [1, 2, 3, 2, 3, 1]);
  assert.deepEqual(tr.nodes.map((n) => n.row), [0, 0, 0, 1, 1, 2]); // a node sits on its first branch's row
  assert.deepEqual(tr.nodes[0].children, [1, 3]);
  assert.equal(tr.width, 3);
  assert.equal(tr.depth, 3);
  assert.deepEqual(tr.pending, { token: 11, piece: " b" }); // the newest committed token: the prompt's last
  assert.match(treeSummary(tr), /^3 branches, 3 deep, 6 nodes: 2 accepted, 3 rejected, 1 never reached$/);
});

test("the target's choice at each depth: matches along the path, then the final token with its alternatives", () => {
  const tr = seqSlice(reduceAll(initialState(0), treeSession()).rounds)[0].tree;
  assert.deepEqual(tr.choices.map((c) => [c.depth, c.token, c.kind, c.node]), [[1, 40, "match", 0], [2, 43, "match", 3], [3, 50, "correction", null]]);
  assert.deepEqual(tr.choices[0].drafted, [40, 45]); // the pending token's children
  assert.deepEqual(tr.choices[2].drafted, [44]); // what the tree offered where the target chose 50
  // the row's next most probable tokens other than the choice (as a session reports them)
  assert.deepEqual(tr.choices[2].alternatives, [{ token: 44, piece: "e", prob: 0.2 }, { token: 9, piece: "z", prob: 0.1 }]);
});

test("a path that stops at the pending token refuses its children and leaves every other node unreached", () => {
  const s = reduceAll(initialState(0), treeSession());
  const tr = seqSlice(s.rounds)[2].tree;
  assert.deepEqual(tr.path, []);
  assert.equal(fates(tr), "ruuuur");
  assert.deepEqual(tr.choices.map((c) => [c.depth, c.token, c.kind]), [[1, 51, "correction"]]);
  // the pending token skips the previous round's rejected token: round 2 committed 60 then 62
  assert.equal(tr.pending.token, 62);
});

test("a chain round keeps no tree, and the chain view's tokens are the kept branch's", () => {
  const s = reduceAll(initialState(0), treeSession());
  const rs = seqSlice(s.rounds);
  assert.equal(rs[1].tree, null);
  assert.deepEqual(seqSlice(s.trees).map((r) => r.round), [1, 3]);
  const round1 = seqSlice(s.tokens).filter((t) => t.round === 1).map((t) => t.status + ":" + t.id);
  assert.deepEqual(round1, ["accepted:40", "accepted:43", "correction:50", "rejected:44"]);
  assert.equal(rs[0].drafted, 3); // the kept branch, as a chain
  // a session without trees has none
  const plain = reduceAll(initialState(0), [started(), drafted(1, [5]), verified(1, 2, 4), accepted(1, [5], 6, "bonus", 3), telemetry(1)]);
  assert.equal(plain.trees.length, 0);
  assert.equal(seqSlice(plain.rounds)[0].tree, null);
});

test("a rewind drops the tree rounds after it; a state is never modified", () => {
  const s = reduceAll(initialState(0), treeSession());
  const before = s.trees;
  const r = reduce(s, rewound(2, 9));
  assert.deepEqual(seqSlice(r.trees).map((x) => x.round), [1]);
  assert.equal(s.trees, before);
  assert.equal(s.trees.length, 2);
});

test("branches computed from the parents match the drafter's (depth first, first children first)", () => {
  assert.deepEqual(treeBranches(TREE.parents), TREE.branches);
  assert.deepEqual(treeBranches([-1, 0, 1]), [[0, 1, 2]]);
  assert.deepEqual(treeBranches([]), []);
  // a tree without its branches or depths (an older or hand-made event) is laid out from its parents
  const bare = treeRound({ round: 1, tree: { tokens: TREE.tokens, parents: TREE.parents, probs: TREE.probs } }, null, { tree_path: [5] });
  assert.deepEqual(bare.nodes.map((n) => [n.depth, n.row]), [[1, 0], [2, 0], [3, 0], [2, 1], [3, 1], [1, 2]]);
  assert.equal(fates(bare), "ruuuua");
  assert.equal(treeRound({ round: 1, tree: null }, null, null), null);
});

test("the layout: a column per depth, a row per branch, edges from parent to child, the target's lane above", () => {
  const tr = seqSlice(reduceAll(initialState(0), treeSession()).rounds)[0].tree;
  const g = TREE_GEOMETRY;
  const L = treeLayout(tr);
  assert.deepEqual(L.root, { x: g.pad, y: g.lane + g.pad });
  assert.deepEqual(L.boxes.map((b) => [(b.x - g.pad) / g.col, (b.y - g.lane - g.pad) / g.row]), [[1, 0], [2, 0], [3, 0], [2, 1], [3, 1], [1, 2]]);
  assert.equal(L.edges.length, 6);
  const e4 = L.edges.find((e) => e.to === 4);
  assert.equal(e4.from, 3);
  assert.equal(e4.status, "rejected");
  assert.ok(e4.d.startsWith("M" + (L.boxes[3].x + g.nodeW) + "," + (L.boxes[3].y + g.nodeH / 2)));
  assert.equal(L.edges.find((e) => e.to === 5).from, TREE_ROOT);
  assert.deepEqual(L.choices.map((c) => [c.depth, c.x, c.y]), [1, 2, 3].map((d) => [d, g.pad + d * g.col, g.pad]));
  assert.ok(L.width >= L.boxes[2].x + g.nodeW && L.height >= L.boxes[5].y + g.nodeH);
});
