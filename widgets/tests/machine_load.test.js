// How much of the machine a run had, in the front-end: the reducer keeps the telemetry's CPU share with the
// memory figures, and the memory chart's sub line says it, with the busy clause only where the telemetry
// called the share busy (the rule is Python's: decoding/machine_load.py). No DOM, no plotly.
import assert from "node:assert/strict";
import test from "node:test";

import { chartSpec } from "../inspector/chart_specs.js";
import { cpuShare, initialState, memorySummary, reduceAll } from "../inspector/state.js";
import { accepted, drafted, memoryTelemetry, started, telemetry, verified } from "./events.js";

const palette = { green: "G", red: "R", blue: "B", amber: "A", teal: "T", muted: "M", grid: "g", border: "b", fg2: "f" };
const opts = { palette, width: 500, config: { strategy: "prompt-lookup", knobs: {} } };

function session(cpu) {
  return [
    started({ strategy: "prompt-lookup" }),
    drafted(1, [20, 21]), verified(1, 2, 5), accepted(1, [20], 30, "correction", 3),
    telemetry(1, { kv: 4, ...memoryTelemetry(), ...cpu }),
  ];
}

test("cpuShare: the share in percent of the threads, busy only as the telemetry says", () => {
  const busy = cpuShare({ cpu_share: 0.384, n_threads: 2, cpu_busy: true });
  assert.deepEqual(busy, { share: 0.384, threads: 2, busy: true, text: "CPU share 38% of 2 threads: the machine was busy" });
  // a low share the telemetry did not call busy is not marked here: the threshold lives in Python only
  assert.equal(cpuShare({ cpu_share: 0.384, n_threads: 2, cpu_busy: false }).text, "CPU share 38% of 2 threads");
  assert.equal(cpuShare({ cpu_share: 0.9, n_threads: 1, cpu_busy: false }).text, "CPU share 90% of 1 thread");
  assert.equal(cpuShare({ cpu_share: null, n_threads: 2, cpu_busy: false }), null); // no rounds timed yet
  assert.equal(cpuShare({ tokens_per_second: 10 }), null); // a recording made before the figure existed
  assert.equal(cpuShare(null), null);
});

test("the reducer keeps the last telemetry's CPU share with the memory figures", () => {
  const s = reduceAll(initialState(0), session({ cpu_seconds: 0.76, n_threads: 2, cpu_share: 0.38, cpu_busy: true }));
  assert.equal(s.memory.cpu.busy, true);
  assert.equal(s.memory.cpu.threads, 2);
  assert.equal(memorySummary(memoryTelemetry()).cpu, null); // older telemetry: no share
});

test("the memory chart's sub line says the CPU share, and that the machine was busy only when it was", () => {
  const busy = chartSpec("mem", reduceAll(initialState(0), session({ n_threads: 2, cpu_share: 0.38, cpu_busy: true })), opts);
  assert.match(busy.sub, /CPU clock 2400 MHz \(max 2800\); CPU share 38% of 2 threads: the machine was busy$/);
  const quiet = chartSpec("mem", reduceAll(initialState(0), session({ n_threads: 2, cpu_share: 0.95, cpu_busy: false })), opts);
  assert.match(quiet.sub, /; CPU share 95% of 2 threads$/);
  const old = chartSpec("mem", reduceAll(initialState(0), session({})), opts);
  assert.doesNotMatch(old.sub, /CPU share/);
});
