// A batched run in the inspector: the reducer's batch_step handling, the lanes of one step (rows per slot,
// accepted and rejected draft cells), the busy-sequences chart and the advice's speedup-against-concurrency
// chart with its break-even marks. No DOM.
import assert from "node:assert/strict";
import test from "node:test";

import { batchSummary, laneCells, shownStep, stepLanes } from "../inspector/batch_specs.js";
import { BATCH_STEPS, busySpec, parallelSpec } from "../inspector/chart_specs.js";
import { seqSlice } from "../inspector/seq.js";
import { initialState, reduce, reduceAll } from "../inspector/state.js";
import { adviceParallel } from "../inspector/views/advice.js";
import { session, started } from "./events.js";

/** A lane as specviz/decoding/batch.py lane_of writes it. */
function lane(slot, request, round, drafted, accepted, over = {}) {
  return { slot, request, round, position: 20 + round, rows: drafted + 1, drafted, accepted, committed: accepted + 1, finished: null, ...over };
}

/** A batch_step event (BatchStepped.to_dict()). */
function step(n, lanes, over = {}) {
  return { kind: "batch_step", round: n, n_parallel: 3, decode_seconds: 0.004, queued: 0, lanes, ...over };
}

/** Three slots, four requests: request 3 waits for a free slot and takes slot 1 at step 3; slot 2 idles last. */
function run() {
  return [
    step(1, [lane(0, 0, 1, 3, 2), lane(1, 1, 1, 3, 0), lane(2, 2, 1, 0, 0)], { queued: 1 }),
    step(2, [lane(0, 0, 2, 4, 4), lane(1, 1, 2, 2, 1, { finished: "max_tokens" }), lane(2, 2, 2, 1, 1, { finished: "stop" })], { queued: 1 }),
    step(3, [lane(0, 0, 3, 2, 0), lane(1, 3, 1, 3, 3)]),
    step(4, [lane(1, 3, 2, 0, 0, { rows: 0 })], { decode_seconds: 0 }),
  ];
}

test("a one-request session has no batch; its state is as before", () => {
  const s = reduceAll(initialState(0), session());
  assert.equal(s.batch, null);
  assert.equal(s.rounds.length, 3);
});

test("batch_step events fold into the run's steps: busy sequences, rows, slots and requests", () => {
  const s = reduceAll(initialState(0), [started(), ...run()]);
  const b = s.batch;
  assert.equal(b.steps.length, 4);
  const st = seqSlice(b.steps);
  assert.deepEqual(st.map((x) => x.busy), [3, 3, 2, 0]); // a lane with no rows is not in the decode
  assert.deepEqual(st.map((x) => x.rows), [4 + 4 + 1, 5 + 3 + 2, 3 + 4, 0]);
  assert.deepEqual(st.map((x) => x.queued), [1, 1, 0, 0]);
  assert.equal(st[0].decodeMs, 4);
  assert.equal(b.nParallel, 3);
  assert.equal(b.decodes, 3); // the fourth step decoded nothing
  assert.equal(b.busySum, 8);
  assert.equal(b.maxBusy, 3);
  assert.deepEqual(b.requests, [0, 1, 2, 3]);
  assert.equal(b.followed, 0);
  // the per-round state of the followed request is untouched by the steps
  assert.equal(s.rounds.length, 0);
  assert.equal(s.n, 5);
});

test("the steps survive the followed request's start, and a state is never modified", () => {
  const first = reduce(initialState(0), run()[0]);
  const s = reduce(first, started());
  assert.equal(s.batch, first.batch);
  assert.equal(s.started.kind, "session_started");
  const before = JSON.stringify(seqSlice(first.batch.steps));
  reduce(first, run()[1]);
  assert.equal(JSON.stringify(seqSlice(first.batch.steps)), before);
});

test("a lane's cells: its pending token, then accepted draft tokens, then rejected ones", () => {
  assert.deepEqual(laneCells(lane(0, 0, 1, 3, 2)).map((c) => c.kind), ["pending", "accepted", "accepted", "rejected"]);
  assert.deepEqual(laneCells(lane(0, 0, 1, 0, 0)).map((c) => c.kind), ["pending"]);
  assert.deepEqual(laneCells(lane(0, 0, 1, 2, 0, { rows: 0 })), []); // its token came with its prompt: no rows
  assert.deepEqual(laneCells(lane(0, 0, 1, 1, 0, { rows: 3 })).map((c) => c.kind), ["pending", "rejected", "other"]);
});

test("a step is one row per slot: the request it served and its rows, idle slots included", () => {
  const b = reduceAll(initialState(0), run()).batch;
  const L = stepLanes(b, 2);
  assert.equal(L.step, 3);
  assert.equal(L.busy, 2);
  assert.deepEqual(L.slots.map((x) => (x.idle ? "idle" : x.request)), [0, 3, "idle"]);
  assert.deepEqual(L.slots.map((x) => (x.idle ? 0 : x.cells.length)), [3, 4, 0]);
  assert.equal(L.slots[0].followed, true);
  assert.equal(L.slots[1].followed, false);
  assert.equal(L.slots[1].cells.filter((c) => c.kind === "accepted").length, 3);
  assert.equal(L.slots[0].text, "3 rows: 0/2 accepted, +1");
  assert.match(stepLanes(b, 1).slots[1].text, /finished: max_tokens/);
  assert.equal(stepLanes(b, 3).slots[1].text, "no rows (its token came with its prompt)");
  assert.equal(stepLanes(b, 9), null);
  assert.equal(shownStep(b, null), 3); // follows the newest
  assert.equal(shownStep(b, 1), 1);
  assert.equal(shownStep(b, 7), 3);
  assert.equal(shownStep(null, null), -1);
  assert.equal(batchSummary(b), "3 slots · 4 steps · 2.67 busy sequences per decode · 4 requests · the token stream shows request 0");
});

test("busy sequences over time: a bar per step, the queue, the slots; the shown step in the accent colour", () => {
  const b = reduceAll(initialState(0), run()).batch;
  const spec = busySpec(b, { palette: { blue: "B", accent: "A", amber: "Y", muted: "M" }, selected: 2 });
  assert.deepEqual(spec.data[0].x, [1, 2, 3, 4]);
  assert.deepEqual(spec.data[0].y, [3, 3, 2, 0]);
  assert.deepEqual(spec.data[0].marker.color, ["B", "A", "B", "B"]);
  assert.deepEqual(spec.data[0].marker.opacity, [0.55, 1, 0.55, 0.55]);
  assert.deepEqual(spec.data[1].y, [1, 1, 0, 0]);
  assert.equal(spec.layout.shapes[0].y0, 3); // the slots
  assert.equal(spec.legend[2][1], "slots (3)");
  assert.ok(busySpec(null, {}).note);
  // a long run: only the most recent steps are drawn
  let s = initialState(0);
  for (let k = 1; k <= BATCH_STEPS + 30; k++) s = reduce(s, step(k, [lane(0, 0, k, 1, 1)]));
  const long = busySpec(s.batch, { palette: {} });
  assert.equal(long.data[0].x.length, BATCH_STEPS);
  assert.equal(long.data[0].x[0], 31);
});

/** The advice's `parallel` part as ParallelAdvice.to_dict() writes it (specviz/analysis/advise_parallel.py). */
function parallel() {
  return {
    by_parallel: [
      { parallel: 1, setting: "prompt-lookup (draft_max 8, draft_min 0)", flags: "--spec-type ngram-simple", predicted_speedup: 1.8, tokens_per_second: 90, total_tokens_per_second: 90 },
      { parallel: 2, setting: "prompt-lookup (draft_max 8, draft_min 0)", flags: "--spec-type ngram-simple", predicted_speedup: 1.3, tokens_per_second: 60, total_tokens_per_second: 120 },
      { parallel: 4, setting: "prompt-lookup (draft_max 2, draft_min 0)", flags: "--spec-type ngram-simple --spec-draft-n-max 2", predicted_speedup: 1.05, tokens_per_second: 40, total_tokens_per_second: 160 },
      { parallel: 8, setting: "none", flags: "--spec-type none", predicted_speedup: 1.0, tokens_per_second: 25, total_tokens_per_second: 200 },
    ],
    settings: {
      none: { flags: "--spec-type none", speedups: { 1: 1, 2: 1, 4: 1, 8: 1 }, break_even_parallel: null },
      "prompt-lookup (draft_max 8, draft_min 0)": { flags: "--spec-type ngram-simple", speedups: { 1: 1.8, 2: 1.3, 4: 0.9, 8: 0.6 }, break_even_parallel: 3 },
      "prompt-lookup (draft_max 2, draft_min 0)": { flags: "--spec-type ngram-simple --spec-draft-n-max 2", speedups: { 1: 1.4, 2: 1.2, 4: 1.05, 8: 0.95 }, break_even_parallel: 8 },
    },
    break_even_parallel: 3,
    best_single: { setting: "prompt-lookup (draft_max 2, draft_min 0)", flags: "--spec-type ngram-simple --spec-draft-n-max 2" },
    load: { 1: 1, 2: 1, 4: 1, 8: 1 }, load_aware_gain: 0.123, lane_seconds: 0.001, looked_up_to: 8, cost_source: "given",
  };
}

test("speedup against concurrency: a line per setting, the 1.0 line, each break-even marked", () => {
  const spec = parallelSpec(parallel(), { palette: { blue: "B", amber: "Y", muted: "M" } });
  const lines = spec.data.filter((d) => d.mode === "lines+markers");
  assert.deepEqual(lines.map((d) => d.name), ["prompt-lookup (draft_max 8, draft_min 0)", "prompt-lookup (draft_max 2, draft_min 0)"]);
  assert.deepEqual(lines[0].x, [1, 2, 4, 8]);
  assert.deepEqual(lines[0].y, [1.8, 1.3, 0.9, 0.6]);
  const marks = spec.data.filter((d) => d.mode === "markers+text");
  // 3 is between the points drawn: marked on the 1.0 line; 8 is a point: marked on it
  assert.deepEqual(marks.map((d) => [d.x[0], d.y[0], d.text[0]]), [[3, 1.0, "break-even 3"], [8, 0.95, "break-even 8"]]);
  assert.deepEqual(marks.map((d) => d.marker.color), ["B", "Y"]);
  const one = spec.layout.shapes.find((sh) => sh.xref === "paper");
  assert.deepEqual([one.y0, one.y1], [1, 1]);
  assert.deepEqual(spec.layout.shapes.filter((sh) => sh.yref === "paper").map((sh) => sh.x0), [3, 8]);
  assert.deepEqual(spec.series.map((s) => s.text), ["break-even at 3", "break-even at 8"]);
  assert.equal(spec.breakEven, 3);
  assert.ok(spec.layout.yaxis.range[0] < 0.6 && spec.layout.yaxis.range[1] > 1.8);
});

test("a setting that pays everywhere, one that never pays, and no setting at all", () => {
  const par = parallel();
  par.settings["prompt-lookup (draft_max 8, draft_min 0)"].break_even_parallel = null;
  par.settings["prompt-lookup (draft_max 2, draft_min 0)"].break_even_parallel = 1;
  const spec = parallelSpec(par, { palette: {} });
  assert.deepEqual(spec.series.map((s) => s.text), ["pays up to 8 at once", "does not pay even alone"]);
  assert.equal(spec.data.filter((d) => d.mode === "markers+text").length, 1);
  assert.ok(parallelSpec({ settings: { none: { speedups: { 1: 1 }, break_even_parallel: null } } }, { palette: {} }).note);
});

test("the panel's words under load are Python's figures", () => {
  assert.equal(adviceParallel({}), null);
  const p = adviceParallel({ parallel: parallel() });
  assert.equal(p.head, "alone, prompt-lookup (draft_max 8, draft_min 0) pays 1.80×; it stops paying at 3 requests at once");
  assert.equal(p.breakEven, 3);
  assert.equal(p.single, "prompt-lookup (draft_max 2, draft_min 0)");
  assert.equal(p.flags, "--spec-type ngram-simple --spec-draft-n-max 2");
  assert.equal(p.gain, "a load-aware schedule (each concurrency's best) would add +12.3% tokens");
  assert.equal(p.source, "batch cost given");
  const none = parallel();
  none.by_parallel[0].setting = "none";
  none.break_even_parallel = null;
  assert.equal(adviceParallel({ parallel: none }).head, "plain decoding is best alone");
});
