// Block drafts and the drafter of each round: the pure helpers and what the reducer keeps of them.
import assert from "node:assert/strict";
import test from "node:test";

import { BLOCK_STATUSES, blockPositions, blockTitle, drafterChanged, strategyOptions } from "../inspector/block.js";
import { seqSlice } from "../inspector/seq.js";
import { initialState, reduceAll } from "../inspector/state.js";
import { blockSession, rewound, session } from "./events.js";

test("each position of a block gets its fate: accepted, the refused one, discarded after it, unused", () => {
  assert.deepEqual(blockPositions(5, 4, 2), ["accepted", "accepted", "rejected", "discarded", "unused"]);
  assert.deepEqual(blockPositions(5, 5, 5), ["accepted", "accepted", "accepted", "accepted", "accepted"]);
  assert.deepEqual(blockPositions(4, 2, 0), ["rejected", "discarded", "unused", "unused"]);
  assert.deepEqual(blockPositions(3, 3, 3), ["accepted", "accepted", "accepted"]);
  assert.deepEqual(blockPositions(0, 0, 0), []);
  assert.ok(blockPositions(7, 6, 1).every((c) => BLOCK_STATUSES.includes(c)));
});

test("a block's title says its kind, size, acceptance and, for DSpark, the confidence of each position", () => {
  const t = blockTitle({ kind: "dspark", size: 6, positions: 6, trained: 6, confidence: [0.9, 0.8, 0.1] }, 2, 1);
  assert.match(t, /^dspark block of 6 \(trained 6\): 1\/6 positions accepted, 2 verified, drafted in parallel/);
  assert.match(t, /confidence 0\.90 0\.80 0\.10$/);
});

test("the drafter is named where a chain changes member, and at a chain's first drafting round", () => {
  assert.equal(drafterChanged("mtp", null, "ngram-mod,mtp"), true);
  assert.equal(drafterChanged("mtp", null, "mtp"), false); // a single strategy: no marker
  assert.equal(drafterChanged("mtp", "ngram-mod", "ngram-mod,mtp"), true);
  assert.equal(drafterChanged("mtp", "mtp", "ngram-mod,mtp"), false);
  assert.equal(drafterChanged(null, "mtp", "ngram-mod,mtp"), false);
});

test("the reducer keeps each round's drafter and block, and every draft token its origin", () => {
  const s = reduceAll(initialState(0), blockSession());
  const r = seqSlice(s.rounds);
  assert.deepEqual(r.map((x) => x.drafter), ["ngram-mod", "dflash", "dflash"]);
  assert.equal(r[0].block, null);
  assert.deepEqual(r[1].block.cells, ["accepted", "accepted", "rejected", "discarded", "unused"]);
  assert.deepEqual(r[2].block.cells, ["accepted", "accepted", "accepted", "accepted", "accepted"]);
  assert.equal(s.lastDrafter, "dflash");
  assert.deepEqual(Object.keys(s.byDrafter), ["ngram-mod", "dflash"]);
  const t = seqSlice(s.tokens).filter((x) => x.round === 2);
  assert.deepEqual(t.map((x) => [x.status, x.drafter || null, x.block ? x.block.positions : null]), [
    ["accepted", "dflash", 5], ["accepted", "dflash", 5], ["correction", null, null], ["rejected", "dflash", 5], ["rejected", "dflash", 5],
  ]);
});

test("a rewind keeps the drafter of the last drafting round it keeps", () => {
  const s = reduceAll(initialState(0), [...blockSession(), rewound(1, 6, { strategy: "ngram-mod,dflash",
    telemetry: { by_drafter: { "ngram-mod": { drafted: 2, accepted: 2 } } } })]);
  assert.equal(s.lastDrafter, "ngram-mod");
  assert.deepEqual(Object.keys(s.byDrafter), ["ngram-mod"]);
});

test("recordings without a drafter name the session's strategy; rounds without a draft name none", () => {
  const r = seqSlice(reduceAll(initialState(0), session()).rounds);
  assert.deepEqual(r.map((x) => x.drafter), ["prompt-lookup", "prompt-lookup", null]);
  assert.ok(r.every((x) => x.block === null));
});

test("the form offers a running chain beside the registered strategies", () => {
  assert.deepEqual(strategyOptions(["none", "mtp"], "ngram-mod,mtp"), ["none", "mtp", "ngram-mod,mtp"]);
  assert.deepEqual(strategyOptions(["none", "mtp"], "mtp"), ["none", "mtp"]);
  assert.deepEqual(strategyOptions([], ""), []);
});
