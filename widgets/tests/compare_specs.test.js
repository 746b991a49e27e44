// The comparison lanes' pure parts: alignment by position, the figures rows and the overlay chart spec.
import assert from "node:assert/strict";
import test from "node:test";

import { alignLanes, laneFigureRows, laneOverlaySpec } from "../inspector/compare_specs.js";

function lane(tokens, over = {}) {
  return { label: "L", tokens, pieces: tokens.map((t) => "t" + t), kinds: tokens.map(() => "accepted"), rounds: tokens.map(() => 1),
    figures: { acceptance_rate: 0.5, mean_accepted_length: 2, tokens_per_second: 40, rounds: 3, per_position_acceptance: [1, 0.5] }, ...over };
}

test("tokens line up by position and the first divergence is marked", () => {
  const cmp = { a: lane([1, 2, 3, 4, 5]), b: lane([1, 2, 9, 4]), first_divergence: 2 };
  const al = alignLanes(cmp, 3);
  assert.equal(al.total, 5);
  assert.deepEqual(al.rows.map((r) => r.start), [0, 3]);
  assert.deepEqual(al.rows[0].a.map((c) => c.id), [1, 2, 3]);
  assert.deepEqual(al.rows[0].b.map((c) => c.id), [1, 2, 9]);
  assert.deepEqual(al.rows[0].a.map((c) => c.diff), [false, false, true]);
  assert.equal(al.rows[0].a[2].first, true);
  assert.equal(al.rows[0].b[2].first, true);
  assert.equal(al.rows[1].b[1], null); // B has no 5th token
  assert.equal(al.rows[1].a[1].diff, false); // nothing to differ from
  assert.equal(alignLanes(cmp, 2, 3).shown, 3);
  assert.deepEqual(alignLanes(null).rows, []);
});

test("figures rows give both lanes and the difference", () => {
  const cmp = { a: lane([1, 2]), b: lane([1, 2, 3], { figures: { acceptance_rate: 0.75, mean_accepted_length: 3.5, tokens_per_second: 80, rounds: 2 } }) };
  const rows = Object.fromEntries(laneFigureRows(cmp).map((r) => [r[0], r.slice(1)]));
  assert.deepEqual(rows.acceptance, ["50.0%", "75.0%", "+25.0 pts"]);
  assert.deepEqual(rows["mean accepted length"], ["2.00", "3.50", "+1.50"]);
  assert.deepEqual(rows["tokens/s"], ["40.0", "80.0", "2.00×"]);
  assert.deepEqual(rows.rounds, ["3", "2", "-1"]);
  assert.deepEqual(rows.generated, ["2", "3", "+1"]);
});

test("the overlay spec has one series per lane, padded to the longer", () => {
  const cmp = { a: lane([1]), b: lane([1], { figures: { per_position_acceptance: [0.9, 0.8, 0.7] } }) };
  const spec = laneOverlaySpec(cmp, { palette: {} });
  assert.equal(spec.data.length, 2);
  assert.deepEqual(spec.data[0].x, [1, 2, 3]);
  assert.deepEqual(spec.data[0].y, [1, 0.5, null]);
  assert.deepEqual(spec.data[1].y, [0.9, 0.8, 0.7]);
  assert.deepEqual(spec.layout.yaxis.range, [0, 1.05]);
  const empty = laneOverlaySpec({ a: lane([], { figures: {} }), b: lane([], { figures: {} }) }, {});
  assert.ok(empty.note);
});
