// The append-only sequence behind the state's token and round lists.
import assert from "node:assert/strict";
import test from "node:test";

import { EMPTY_SEQ, seqAt, seqLast, seqPush, seqSlice } from "../inspector/seq.js";

test("push appends in order across block boundaries and leaves the old sequence as it was", () => {
  let s = EMPTY_SEQ;
  const olds = [];
  for (let i = 0; i < 1000; i += 7) {
    olds.push([s, s.length, s.length ? seqSlice(s) : []]);
    s = seqPush(s, Array.from({ length: 7 }, (_, k) => i + k));
  }
  assert.equal(s.length, 1001);
  assert.deepEqual(seqSlice(s), Array.from({ length: 1001 }, (_, k) => k));
  for (const [old, n, items] of olds) { // every earlier version still reads the same
    assert.equal(old.length, n);
    assert.deepEqual(seqSlice(old), items);
  }
  assert.equal(seqAt(s, 0), 0);
  assert.equal(seqAt(s, 256), 256);
  assert.equal(seqAt(s, 1000), 1000);
  assert.equal(seqAt(s, 1001), undefined);
  assert.equal(seqAt(s, -1), undefined);
  assert.equal(seqLast(s), 1000);
  assert.equal(seqLast(EMPTY_SEQ), undefined);
});

test("slice takes negative and out-of-range bounds like Array.prototype.slice", () => {
  const s = seqPush(EMPTY_SEQ, Array.from({ length: 600 }, (_, k) => k));
  const a = Array.from({ length: 600 }, (_, k) => k);
  for (const [f, t] of [[-60, undefined], [0, 5], [590, 700], [-700, 3], [300, 200], [599, 600], [600, 601]]) {
    assert.deepEqual(seqSlice(s, f, t), a.slice(f, t), `slice(${f}, ${t})`);
  }
  assert.equal(seqPush(s, []), s, "pushing nothing returns the same sequence");
});

test("a push shares the full blocks and copies only the last one", () => {
  const s = seqPush(EMPTY_SEQ, Array.from({ length: 600 }, (_, k) => k));
  const t = seqPush(s, [600]);
  assert.equal(t.blocks[0], s.blocks[0]);
  assert.equal(t.blocks[1], s.blocks[1]);
  assert.notEqual(t.blocks[2], s.blocks[2]);
  assert.equal(s.blocks[2].length, 600 - 512);
});
