// Memory kinds in the front-end: checkpoint events in the reducer, checkpoint restores on the KV timeline,
// and the memory chart beside the same model's figures under `none` (no DOM, no plotly).
import assert from "node:assert/strict";
import test from "node:test";

import { chartSpec, fmtBytes } from "../inspector/chart_specs.js";
import { seqSlice } from "../inspector/seq.js";
import { initialState, memorySummary, reduceAll } from "../inspector/state.js";
import {
  accepted, checkpointed, drafted, memoryTelemetry, rewound, rollbackVia, started, telemetry, verified,
} from "./events.js";

const palette = { green: "G", red: "R", blue: "B", amber: "A", teal: "T", muted: "M", grid: "g", border: "b", fg2: "f" };
const opts = { palette, width: 500, config: { strategy: "prompt-lookup", knobs: {} } };

/**
 * A recurrent target: round 1 checkpoints at 2, drafts 3, accepts 1, restores the checkpoint and re-applies
 * 2 tokens (KV 2 → 6 → 4); round 2 drafts 2, all accepted (2 checkpointed, nothing rolled back: 4 → 7);
 * round 3 rolls back by removal (7 → 9 → 8).
 */
function recurrentSession() {
  return [
    started({ strategy: "prompt-lookup" }),
    drafted(1, [20, 21, 22]), checkpointed(1, "target", 2), verified(1, 2, 6), accepted(1, [20], 30, "correction", 3),
    rollbackVia(1, "target", 6, 4, "checkpoint", { mark_pos: 2, reapplied: 2 }), telemetry(1, { kv: 4, ...memoryTelemetry() }),
    drafted(2, [23, 24]), checkpointed(2, "target", 4, { reused: true, seconds: 0 }), verified(2, 4, 7),
    accepted(2, [23, 24], 31, "bonus", 5), telemetry(2, { kv: 7, ...memoryTelemetry() }),
    drafted(3, [25]), verified(3, 7, 9), accepted(3, [], 32, "correction", 8), rollbackVia(3, "target", 9, 8, "partial"),
    telemetry(3, { kv: 8, ...memoryTelemetry({ marks: 3, marks_bytes: 58596 }) }),
  ];
}

test("the reducer keeps each round's checkpoints and rollback paths, and the last memory figures", () => {
  const s = reduceAll(initialState(0), recurrentSession());
  const rounds = seqSlice(s.rounds);
  assert.equal(rounds.length, 3);
  assert.equal(rounds[0].checkpoints.target.position, 2);
  assert.equal(rounds[0].rollbacks.target.path, "checkpoint");
  assert.equal(rounds[1].checkpoints.target.reused, true);
  assert.equal(rounds[1].rollbacks.target, null);
  assert.equal(rounds[2].checkpoints.target, null);
  assert.equal(rounds[2].rss, 300 << 20);
  const all = reduceAll(initialState(0), recurrentSession().slice(0, 7));
  assert.equal(all.memory.kind, "recurrent");
  assert.equal(all.memory.marks, 2);
  assert.equal(s.memory.marks, 3); // the latest telemetry wins
});

test("memorySummary: this run beside none, in bytes; a draft model and saved states only in the run", () => {
  const draft = { kind: "hybrid", removal: "full", n_rs_seq: 0, weight_bytes: 1000, kv_bytes: 200, swa_kv_bytes: 0,
    recurrent_bytes: 50, marks: 1, marks_bytes: 40 };
  const m = memorySummary(memoryTelemetry({ kv_bytes: 4096 }, draft));
  assert.deepEqual(m.none, { weights: 425728, kv: 4096, swa: 0, recurrent: 19532, draft: 0, marks: 0 });
  assert.deepEqual(m.run, { weights: 425728, kv: 4096, swa: 0, recurrent: 19532, draft: 1250, marks: 39064 + 40 });
  assert.equal(m.marks, 3);
  assert.equal(m.rss, 300 << 20);
  assert.equal(memorySummary({}), null);
  assert.equal(memorySummary(null), null);
});

test("KV timeline: a checkpoint restore is drawn apart from a removal, and the checkpoints are marked", () => {
  const spec = chartSpec("kv", reduceAll(initialState(0), recurrentSession()), opts);
  assert.equal(spec.data.length, 4);
  const [committed, removed, restoredBars, marks] = spec.data;
  assert.deepEqual(committed.base, [2, 4, 7]);
  assert.deepEqual(removed.y, [0, 0, 1]); // round 3 removed its tail
  assert.deepEqual(restoredBars.y, [2, 0, 0]); // round 1 restored the checkpoint
  assert.deepEqual(restoredBars.base, [4, 7, 8]);
  assert.match(restoredBars.customdata[0][0], /restored the state saved at 2/);
  assert.equal(restoredBars.customdata[0][1], 2);
  assert.deepEqual(marks.x, [1, 2]);
  assert.deepEqual(marks.y, [2, 4]);
  assert.equal(marks.customdata[1][2], " (reused)");
  assert.deepEqual(spec.legend.map((l) => l[1]),
    ["target: committed", "target: rolled back", "target: restored a checkpoint", "checkpoint saved"]);
});

test("KV timeline: no checkpoint traces on attention memory (the shape the other tests pin)", () => {
  const evs = [started(), drafted(1, [20, 21]), verified(1, 2, 5), accepted(1, [20], 30, "correction", 3),
    rollbackVia(1, "target", 5, 4, "truncate"), telemetry(1, { kv: 4 })];
  const spec = chartSpec("kv", reduceAll(initialState(0), evs), opts);
  assert.equal(spec.data.length, 2);
  assert.deepEqual(spec.data[1].y, [1]);
});

test("memory chart: a note before any figures; stacked MiB bars for none and this run; machine figures or 'not available'", () => {
  assert.ok(chartSpec("mem", initialState(0), opts).note);
  const spec = chartSpec("mem", reduceAll(initialState(0), recurrentSession()), opts);
  assert.deepEqual(spec.data.map((d) => d.name), ["weights", "recurrent state", "saved states"]);
  const marks = spec.data[2];
  assert.deepEqual(marks.y, ["none", "this run"]);
  assert.deepEqual(marks.x, [0, 58596 / 1048576]);
  assert.equal(spec.layout.barmode, "stack");
  assert.ok(spec.layout.xaxis.range[1] >= (425728 + 19532 + 58596) / 1048576);
  assert.match(spec.sub, /recurrent memory; process resident 300\.0 MiB, peak 310\.0 MiB/);
  assert.match(spec.sub, /temperature not available, CPU clock 2400 MHz \(max 2800\)/);
  assert.deepEqual(spec.legend.map((l) => l[0]), ["sv-sw-mem-weights", "sv-sw-mem-recurrent", "sv-sw-mem-marks"]);
  JSON.stringify(spec);
});

test("a rewind keeps the memory figures of its telemetry", () => {
  const evs = [...recurrentSession(), rewound(1, 7, { telemetry: { rounds: 1, ...memoryTelemetry({ marks: 1, marks_bytes: 19532 }) } })];
  const s = reduceAll(initialState(0), evs);
  assert.equal(s.memory.marks, 1);
});

test("byte counts for people", () => {
  assert.deepEqual([0, 1000, 2048, 19532, 5 << 20, 3 * 1024 ** 3].map(fmtBytes), ["0 B", "1000 B", "2.00 KiB", "19.1 KiB", "5.00 MiB", "3.00 GiB"]);
  assert.equal(fmtBytes(null), "?");
});
