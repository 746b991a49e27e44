// The reducer: hand-made event sequences → the state the views and charts read.
import assert from "node:assert/strict";
import test from "node:test";

import { seqSlice } from "../inspector/seq.js";
import { initialState, reduce, reduceAll } from "../inspector/state.js";
import { accepted, drafted, finished, knobsChanged, rejected, rollback, session, started, telemetry, verified } from "./events.js";

const statuses = (s) => seqSlice(s.tokens).map((t) => t.status + ":" + t.id);
const rounds = (s) => seqSlice(s.rounds);

test("the initial state holds nothing and no epoch", () => {
  const s = initialState();
  assert.equal(s.epoch, -1);
  assert.equal(s.n, 0);
  assert.equal(s.tokens.length, 0);
  assert.equal(s.rounds.length, 0);
  assert.equal(s.started, null);
  assert.equal(s.tel, null);
  assert.equal(initialState(4).epoch, 4);
});

test("tokens get their status: prompt, accepted, correction, rejected, bonus, plain", () => {
  const s = reduceAll(initialState(0), session());
  assert.deepEqual(statuses(s), [
    "prompt:2", "prompt:10", "prompt:11",
    "accepted:20", "accepted:21", "correction:30", "rejected:22",
    "accepted:23", "accepted:24", "bonus:31",
    "plain:32",
  ]);
  const t = seqSlice(s.tokens);
  assert.deepEqual(t.slice(0, 3).map((x) => [x.piece, x.pos, x.round]), [["<bos>", 0, 0], ["a", 1, 0], [" b", 2, 0]]);
  // accepted draft tokens: depth, position, the drafter's and the target's probability
  assert.deepEqual([t[4].depth, t[4].pos, t[4].draftP, t[4].targetP, t[4].round], [1, 4, 0.9, 0.8, 1]);
  // the target's token closes the round at the depth after the accepted ones, with its own probability
  assert.deepEqual([t[5].depth, t[5].pos, t[5].targetP, t[5].draftP], [2, 5, 0.7, undefined]);
  // a rejected token carries the rejection (alternatives) and, being the first, the target's p of it
  assert.equal(t[6].rejection.kind, "rejected");
  assert.deepEqual([t[6].depth, t[6].first, t[6].targetP, t[6].draftP, t[6].piece], [2, true, 0.05, 0.4, "r22"]);
  assert.equal(t[9].piece, "p31");
  assert.equal(s.n, session().length);
  assert.equal(s.epoch, 0);
});

test("only the first rejected token carries the target's probability; all carry the rejection", () => {
  const evs = [started(), drafted(1, [20, 21, 22]), verified(1, 2, 6), accepted(1, [], 40, "correction", 3), rejected(1, 0, [20, 21, 22], 40)];
  const rej = seqSlice(reduceAll(initialState(), evs).tokens).filter((t) => t.status === "rejected");
  assert.deepEqual(rej.map((t) => [t.id, t.depth, t.first, t.targetP]), [[20, 0, true, 0.05], [21, 1, false, null], [22, 2, false, null]]);
  assert.ok(rej.every((t) => t.rejection && t.rejection.target_token === 40));
});

test("each round is summarised when its telemetry arrives", () => {
  const s = reduceAll(initialState(0), session());
  const r = rounds(s);
  assert.deepEqual(r.map((x) => [x.round, x.drafted, x.accepted, x.committed]), [[1, 3, 2, 3], [2, 2, 2, 3], [3, 0, 0, 1]]);
  assert.deepEqual(r.map((x) => x.rate), [2 / 3, 1, null]);
  assert.deepEqual(r.map((x) => x.cumRate), [2 / 3, 0.8, 0.8]);
  assert.deepEqual(r.map((x) => [x.draftMs, x.verifyMs, x.tps, x.tpr]), [[2, 20, 100, 2], [2, 20, 100, 2], [2, 20, 100, 2]]);
  // rounds by tokens committed: two rounds of 3, one of 1
  assert.equal(s.hist[1], 1);
  assert.equal(s.hist[3], 2);
  assert.equal(s.hist[2], undefined);
  assert.equal(s.cur, null);
  assert.equal(s.tel.n_generated, 7);
  assert.equal(s.hasDraftKV, false);
  assert.equal(s.hasExpected, false);
});

test("the target's KV timeline: before → peak → after the rollback, or the telemetry's length without one", () => {
  const r = rounds(reduceAll(initialState(), session()));
  assert.deepEqual(r.map((x) => x.kv), [{ before: 2, peak: 6, after: 5 }, { before: 5, peak: 8, after: 8 }, { before: 8, peak: 9, after: 9 }]);
  assert.deepEqual(r[0].rollbacks.target, rollback(1, "target", 6, 5));
  assert.equal(r[1].rollbacks.target, null);
  // no rollback and no KV length in the telemetry: the peak is kept
  const s = reduceAll(initialState(), [started(), drafted(1, [5]), verified(1, 2, 4), accepted(1, [5], 6, "bonus", 3), telemetry(1, { kv: null })]);
  assert.deepEqual(rounds(s)[0].kv, { before: 2, peak: 4, after: 4 });
});

test("the draft model's context has its own KV timeline and rollbacks", () => {
  const evs = [
    started({ strategy: "draft", draft_model: "/m/draft.gguf" }),
    drafted(1, [20, 21, 22]), verified(1, 2, 6, { draft_kv_before: 2, draft_kv_peak: 5 }),
    accepted(1, [20], 30, "correction", 3), rejected(1, 1, [21, 22], 30),
    rollback(1, "target", 6, 4), rollback(1, "draft", 5, 3), telemetry(1, { kv: 4 }),
    drafted(2, [23]), verified(2, 4, 6, { draft_kv_before: 3, draft_kv_peak: 5 }), accepted(2, [23], 31, "bonus", 5), telemetry(2, { kv: 6 }),
  ];
  const s = reduceAll(initialState(), evs);
  const r = rounds(s);
  assert.equal(s.hasDraftKV, true);
  assert.deepEqual(r[0].kv, { before: 2, peak: 6, after: 4 });
  assert.deepEqual(r[0].draftKv, { before: 2, peak: 5, after: 3 });
  assert.deepEqual(r[0].rollbacks.draft, rollback(1, "draft", 5, 3));
  assert.deepEqual(r[1].draftKv, { before: 3, peak: 5, after: 5 }, "no draft rollback: the draft context keeps its peak");
  // a round without a draft context reports none
  const plain = rounds(reduceAll(initialState(), session()))[0];
  assert.deepEqual(plain.draftKv, { before: null, peak: null, after: null });
});

test("knobs_changed updates the strategy and knobs and nothing else", () => {
  const base = reduceAll(initialState(), session().slice(0, 7));
  const s = reduce(base, knobsChanged(1, "ngram-simple", { draft_max: 2 }));
  assert.equal(s.strategy, "ngram-simple");
  assert.deepEqual(s.knobs, { draft_max: 2 });
  assert.equal(s.knobChanges, 1);
  assert.equal(s.tokens, base.tokens);
  assert.equal(s.rounds, base.rounds);
  assert.equal(s.n, base.n + 1);
  assert.equal(base.strategy, "prompt-lookup");
});

test("a new session_started resets everything but the epoch", () => {
  const s1 = reduceAll(initialState(3), [...session(), finished(3, "max_tokens", 7)]);
  assert.equal(s1.finished.reason, "max_tokens");
  const s2 = reduce(s1, started({ prompt_tokens: [2, 50], prompt_pieces: ["<bos>", "z"], strategy: "none", knobs: {} }));
  assert.equal(s2.epoch, 3);
  assert.equal(s2.n, s1.n + 1);
  assert.deepEqual(statuses(s2), ["prompt:2", "prompt:50"]);
  assert.equal(s2.rounds.length, 0);
  assert.deepEqual(s2.hist, []);
  assert.equal(s2.tel, null);
  assert.equal(s2.finished, null);
  assert.equal(s2.strategy, "none");
  assert.deepEqual(s2.posAcc, []);
});

test("telemetry: the latest data, per-position acceptance kept until a telemetry reports it again", () => {
  const s = reduceAll(initialState(), session().slice(0, 11));
  assert.equal(s.tel.n_generated, 6);
  assert.deepEqual(s.posAcc, [1, 1, 0]);
  assert.deepEqual(s.posTries, [2, 2, 1]);
  const t = { ...telemetry(3, { n_generated: 7 }) };
  delete t.data.per_position_acceptance;
  const s2 = reduceAll(s, [drafted(3, []), verified(3, 8, 9), accepted(3, [], 32, "plain", 9), t]);
  assert.deepEqual(s2.posAcc, [1, 1, 0]);
  assert.equal(s2.tel.n_generated, 7);
  // a telemetry event without data still closes its round
  const s3 = reduceAll(initialState(), [started(), drafted(1, []), verified(1, 2, 3), accepted(1, [], 9, "plain", 3), { kind: "telemetry", round: 1 }]);
  assert.equal(s3.rounds.length, 1);
  assert.deepEqual(s3.tel, {});
});

test("the cost policy's expected tokens are kept per round with their running mean", () => {
  const evs = [started(),
    drafted(1, [20, 21], { expected_tokens: 2.5, policy: "cost" }), verified(1, 2, 5), accepted(1, [20, 21], 30, "bonus", 3), telemetry(1),
    drafted(2, [], { expected_tokens: 1.5, policy: "cost" }), verified(2, 5, 6), accepted(2, [], 31, "plain", 6), telemetry(2),
    drafted(3, [22]), verified(3, 6, 8), accepted(3, [22], 32, "bonus", 7), telemetry(3)];
  const s = reduceAll(initialState(), evs);
  const r = rounds(s);
  assert.equal(s.hasExpected, true);
  assert.deepEqual(r.map((x) => x.expected), [2.5, 1.5, null]);
  assert.deepEqual(r.map((x) => x.expectedMean), [2.5, 2, 2]);
  assert.deepEqual(r.map((x) => x.policy), ["cost", "cost", "fixed"]);
});

test("finished closes a round that got its tokens but no telemetry", () => {
  const evs = [started(), drafted(1, [20]), verified(1, 2, 4), accepted(1, [20], null, null, 3), finished(1, "eos", 1)];
  const s = reduceAll(initialState(), evs);
  assert.equal(s.rounds.length, 1);
  assert.equal(rounds(s)[0].committed, 1);
  assert.equal(s.finished.reason, "eos");
  assert.deepEqual(statuses(s).slice(3), ["accepted:20"], "no target token when generation stopped on an accepted one");
  // finished with nothing pending adds no round
  const s2 = reduceAll(initialState(), [...session(), finished(3, "max_tokens", 7)]);
  assert.equal(s2.rounds.length, 3);
});

test("events of another round start a new one; unknown kinds and junk only advance the count", () => {
  const s = reduceAll(initialState(), [started(), drafted(1, [20]), verified(2, 2, 3), accepted(2, [], 9, "plain", 3), telemetry(2)]);
  const r = rounds(s);
  assert.equal(r.length, 1);
  assert.deepEqual([r[0].round, r[0].drafted], [2, 0], "round 1's draft does not leak into round 2");
  const before = reduceAll(initialState(), session());
  for (const junk of [null, 7, "x", { kind: "no_such_kind", round: 1 }, {}]) {
    const after = reduce(before, junk);
    assert.equal(after.n, before.n + 1);
    assert.equal(after.tokens, before.tokens);
    assert.equal(after.rounds, before.rounds);
  }
});

test("reduce never modifies the state it is given", () => {
  let s = initialState(0);
  for (const ev of [...session(), knobsChanged(3, "none", {}), finished(3, "eos", 7), started()]) {
    const copy = structuredClone(s);
    const next = reduce(s, ev);
    assert.deepEqual(s, copy, "reducing " + ev.kind + " changed the previous state");
    assert.notEqual(next, s);
    s = next;
  }
});

test("reduceAll is reduce over the list", () => {
  const evs = session();
  let s = initialState(1);
  for (const ev of evs) s = reduce(s, ev);
  assert.deepEqual(reduceAll(initialState(1), evs), s);
});
