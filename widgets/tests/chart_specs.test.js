// Chart specifications built from a state: traces, ranges, legends, notes (no DOM, no plotly).
import assert from "node:assert/strict";
import test from "node:test";

import {
  CHART_GAP, CHART_GAP_MAX, CHART_KEYS, CHART_ROUNDS, KV_ROUNDS, chartGap, chartSpec, maxOf, minOf, nice, roundRange,
} from "../inspector/chart_specs.js";
import { initialState, reduceAll } from "../inspector/state.js";
import { accepted, drafted, rollback, session, started, telemetry, verified } from "./events.js";

const palette = { green: "G", red: "R", blue: "B", amber: "A", teal: "T", muted: "M", grid: "g", border: "b", fg2: "f" };
const opts = (over = {}) => ({ palette, width: 500, config: { strategy: "prompt-lookup", knobs: {} }, ...over });
const state = (evs = session()) => reduceAll(initialState(0), evs);

/** n plain rounds of one draft token each (accepted on even rounds), KV growing by 2 per round. */
function manyRounds(n, startOver = {}) {
  const evs = [started(startOver)];
  for (let r = 1; r <= n; r++) {
    const kv = 2 + 2 * (r - 1);
    const ok = r % 2 === 0;
    evs.push(drafted(r, [100 + r]), verified(r, kv, kv + 2), accepted(r, ok ? [100 + r] : [], 200 + r, ok ? "bonus" : "correction", kv + 1));
    if (!ok) evs.push(rollback(r, "target", kv + 2, kv + 1));
    evs.push(telemetry(r, { kv: ok ? kv + 2 : kv + 1, tokens_per_second: r }));
  }
  return evs;
}

test("helpers: nice maxima, extremes, the round range", () => {
  assert.deepEqual([0, -3, 0.7, 1, 1.1, 7, 13, 99, 2400].map(nice), [1, 1, 0.8, 1, 1.2, 8, 15, 100, 2500]);
  assert.equal(maxOf([null, 3, 9, undefined, 2]), 9);
  assert.equal(maxOf([], 7), 7);
  assert.equal(minOf([null, 3, 9, 2]), 2);
  assert.equal(minOf([null], 4), 4);
  assert.deepEqual(roundRange([]), [0.5, 1.5]);
  assert.deepEqual(roundRange([{ round: 3 }, { round: 8 }]), [2.4, 8.6]);
});

test("every chart has a spec for an empty state and for a session; unknown keys have none", () => {
  for (const key of CHART_KEYS) {
    for (const s of [initialState(), state()]) {
      const spec = chartSpec(key, s, opts());
      assert.ok(spec && (spec.note || (Array.isArray(spec.data) && spec.layout)), key);
      if (spec.data) JSON.stringify(spec); // plain data, serialisable
    }
  }
  assert.equal(chartSpec("nope", state(), opts()), null);
});

test("layout: fixed width when known, autosize otherwise, no plotly legend", () => {
  const a = chartSpec("acc", state(), opts()).layout;
  assert.deepEqual([a.width, a.autosize, a.showlegend, a.height], [500, false, false, 210]);
  const b = chartSpec("acc", state(), opts({ width: undefined })).layout;
  assert.deepEqual([b.width, b.autosize], [undefined, true]);
  assert.equal(a.xaxis.autorange, false);
});

test("KV timeline: committed bars from before to after, rolled-back bars from after to the peak", () => {
  const spec = chartSpec("kv", state(), opts());
  assert.equal(spec.data.length, 2);
  const [committed, rolled] = spec.data;
  assert.deepEqual(committed.x, [1, 2, 3]);
  assert.deepEqual(committed.base, [2, 5, 8]);
  assert.deepEqual(committed.y, [3, 3, 1]);
  assert.deepEqual(rolled.base, [5, 8, 9]);
  assert.deepEqual(rolled.y, [1, 0, 0]);
  assert.equal(committed.marker.color, "G");
  assert.equal(rolled.marker.color, "R");
  assert.deepEqual(spec.legend.map((l) => l[1]), ["target: committed", "target: rolled back"]);
  assert.equal(spec.layout.barmode, "overlay");
  assert.deepEqual(spec.layout.xaxis.range, [0.4, 3.6]);
  assert.deepEqual(spec.layout.yaxis.range, [0, 11]); // 2..9, padded by at least 2
});

test("KV timeline: the draft context beside the target's, grouped", () => {
  const evs = [started({ strategy: "draft" }), drafted(1, [20, 21]), verified(1, 2, 5, { draft_kv_before: 2, draft_kv_peak: 4 }),
    accepted(1, [20], 30, "correction", 3), rollback(1, "target", 5, 4), rollback(1, "draft", 4, 3), telemetry(1, { kv: 4 })];
  const spec = chartSpec("kv", state(evs), opts());
  assert.equal(spec.data.length, 4);
  assert.equal(spec.layout.barmode, "group");
  const [dc, dr] = spec.data.slice(2);
  assert.deepEqual([dc.base, dc.y, dr.base, dr.y], [[2], [1], [3], [1]]);
  assert.match(dc.hovertemplate, /draft ctx/);
  assert.match(dr.hovertemplate, /draft rollback/);
  assert.deepEqual(spec.legend.map((l) => l[1]).slice(2), ["draft ctx: committed", "draft ctx: rolled back"]);
});

test("KV timeline: the sliding window's start once the cache outgrows it; only the last KV_ROUNDS rounds", () => {
  const s = state(manyRounds(40, { n_swa: 20 }));
  const spec = chartSpec("kv", s, opts());
  assert.equal(spec.data[0].x.length, KV_ROUNDS);
  assert.equal(spec.data[0].x[0], 40 - KV_ROUNDS + 1);
  const swa = spec.data.find((t) => t.type === "scatter");
  assert.ok(swa, "a sliding-window trace");
  const after = spec.data[0].base.map((b, i) => b + spec.data[0].y[i]);
  assert.deepEqual(swa.y, after.map((a) => Math.max(0, a - 20)));
  assert.equal(spec.legend[spec.legend.length - 1][1], "sliding-window start");
  // no trace while the cache fits in the window
  assert.ok(!chartSpec("kv", state(manyRounds(3, { n_swa: 500 })), opts()).data.some((t) => t.type === "scatter"));
});

test("acceptance rate: per round and cumulative, over the last CHART_ROUNDS rounds", () => {
  const spec = chartSpec("acc", state(), opts());
  assert.deepEqual(spec.data[0].y, [2 / 3, 1, null]);
  assert.deepEqual(spec.data[0].customdata, [[2, 3], [2, 2], [0, 0]]);
  assert.deepEqual(spec.data[1].y, [2 / 3, 0.8, 0.8]);
  const many = chartSpec("acc", state(manyRounds(100)), opts());
  assert.equal(many.data[0].x.length, CHART_ROUNDS);
  assert.equal(many.data[0].x[0], 100 - CHART_ROUNDS + 1);
  assert.deepEqual(many.layout.xaxis.range, [100 - CHART_ROUNDS + 1 - 0.6, 100.6]);
});

test("accepted length: rounds by tokens committed", () => {
  const spec = chartSpec("hist", state(), opts());
  assert.deepEqual(spec.data[0].x, [1, 2, 3]);
  assert.deepEqual(spec.data[0].y, [1, 0, 2]);
  assert.deepEqual(spec.layout.yaxis.range, [0, 2.5]);
});

test("per-position acceptance: a note until the strategy drafts, then one bar per depth", () => {
  assert.match(chartSpec("pos", initialState(), opts()).note, /No draft tokens yet/);
  const spec = chartSpec("pos", state(session().slice(0, 11)), opts());
  assert.deepEqual(spec.data[0].x, [1, 2, 3]);
  assert.deepEqual(spec.data[0].y, [1, 1, 0]);
  assert.deepEqual(spec.data[0].customdata, [2, 2, 1]);
});

test("drafting vs verification: stacked milliseconds, tokens/s on the second axis", () => {
  const spec = chartSpec("time", state(), opts());
  assert.deepEqual(spec.data[0].y, [2, 2, 2]);
  assert.deepEqual(spec.data[1].y, [20, 20, 20]);
  assert.equal(spec.data[0].stackgroup, spec.data[1].stackgroup);
  assert.equal(spec.data[2].yaxis, "y2");
  assert.deepEqual(spec.layout.yaxis.range, [0, 25]);
  assert.deepEqual(spec.layout.yaxis2.range, [0, 120]);
});

test("draft confidence: a note that says why without drafter probabilities, buckets and draft_p_min with them", () => {
  const none = chartSpec("conf", state(), opts());
  assert.match(none.note, /No drafter probabilities: prompt-lookup drafts without a probability/);
  const waiting = chartSpec("conf", state(), opts({ config: { strategy: "draft", knobs: {} } }));
  assert.match(waiting.note, /No draft tokens yet/);
  const buckets = [{ lo: 0, hi: 0.5, tries: 4, accepted: 1, rate: 0.25 }, { lo: 0.5, hi: 1, tries: 0, accepted: 0, rate: 0 }];
  const s = state([...session(), { ...telemetry(4, { draft_buckets: buckets }) }]);
  const spec = chartSpec("conf", s, opts({ config: { strategy: "draft", knobs: { draft_p_min: 0.3 } } }));
  assert.deepEqual(spec.data[0].x, [0.25, 0.75]);
  assert.deepEqual(spec.data[0].y, [0.25, null], "an empty bucket has no bar");
  assert.deepEqual(spec.data[1].y, [4, 0]);
  assert.equal(spec.layout.shapes[0].x0, 0.3);
  assert.equal(spec.legend[2][1], "draft_p_min = 0.3");
  for (const strategy of ["eagle3", "mtp"]) {  // every model drafter's draft_p_min is marked
    const m = chartSpec("conf", s, opts({ config: { strategy, knobs: { draft_p_min: 0.4 } } }));
    assert.equal(m.layout.shapes[0].x0, 0.4, strategy);
  }
  const other = chartSpec("conf", s, opts({ config: { strategy: "ngram-simple", knobs: { draft_p_min: 0.3 } } }));
  assert.deepEqual(other.layout.shapes, []);
  assert.equal(other.legend.length, 2);
});

test("tokens per round: realised, and the cost policy's expectation when there is one", () => {
  const plain = chartSpec("tpr", state(), opts());
  assert.equal(plain.data.length, 2);
  assert.deepEqual(plain.data[0].y, [3, 3, 1]);
  assert.match(plain.sub, /draft_policy = cost/);
  const evs = [started(), drafted(1, [20, 21], { expected_tokens: 2.5, policy: "cost" }), verified(1, 2, 5),
    accepted(1, [20, 21], 30, "bonus", 3), telemetry(1, { tokens_per_round: 3 })];
  const cost = chartSpec("tpr", state(evs), opts());
  assert.equal(cost.data.length, 4);
  assert.deepEqual(cost.data[2].y, [2.5]);
  assert.deepEqual(cost.data[3].y, [2.5]);
  assert.match(cost.sub, /cost policy's expectation/);
  assert.deepEqual(cost.layout.yaxis.range, [0, 4]);
});

test("chartGap: nine times a redraw, within [CHART_GAP, CHART_GAP_MAX]", () => {
  assert.equal(chartGap(0), CHART_GAP); // nothing drawn yet
  assert.equal(chartGap(NaN), CHART_GAP);
  assert.equal(chartGap(-3), CHART_GAP);
  assert.equal(chartGap(5), CHART_GAP); // a fast machine: 45 ms is below the least gap
  assert.equal(chartGap(20), 180); // a slow redraw: the charts keep to a tenth of the main thread
  assert.equal(chartGap(40), 360);
  assert.equal(chartGap(500), CHART_GAP_MAX); // however slow, the charts keep moving
});
