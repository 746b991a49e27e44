// The reducer's "rewound" case: a live view (which applied the dropped rounds) and a view built from the
// session's own list (which never saw them) end in the same state.
import assert from "node:assert/strict";
import test from "node:test";

import { seqSlice } from "../inspector/seq.js";
import { initialState, reduceAll } from "../inspector/state.js";
import { accepted, drafted, rewound, session, telemetry, verified } from "./events.js";

const statuses = (s) => seqSlice(s.tokens).map((t) => t.status + ":" + t.id);
const roundsOf = (s) => seqSlice(s.rounds).map((r) => r.round);

test("a rewind to round 1 drops the later rounds' tokens and summaries", () => {
  const all = session();
  const s = reduceAll(initialState(0), [...all, rewound(1, 6)]);
  assert.deepEqual(statuses(s), ["prompt:2", "prompt:10", "prompt:11", "accepted:20", "accepted:21", "correction:30", "rejected:22"]);
  assert.deepEqual(roundsOf(s), [1]);
  assert.equal(s.hist.length, 4);
  assert.equal(s.hist[3], 1);
  assert.equal(s.tel.rounds, 1);
  assert.deepEqual(s.posTries, [1, 1, 1]);
  assert.equal(s.finished, null);
  assert.equal(s.rewinds, 1);
  assert.equal(s.rewound.round, 1);
  assert.equal(s.cur, null);
});

test("a live view and a view of the session's own list agree", () => {
  const all = session();
  const firstRound = all.slice(0, 7); // session_started + round 1 (ends with its telemetry)
  const ev = rewound(1, 6);
  const live = reduceAll(initialState(0), [...all, ev]);
  const fresh = reduceAll(initialState(0), [...firstRound, ev]);
  assert.deepEqual(statuses(live), statuses(fresh));
  assert.deepEqual(roundsOf(live), roundsOf(fresh));
  assert.deepEqual(live.hist, fresh.hist);
  assert.deepEqual(live.tel, fresh.tel);
});

test("a rewind inside a round keeps that round's first tokens as kept, and the next round follows", () => {
  const all = session();
  // round 2 committed 23 24 31 at positions 6..8; keep 23 (position 7 = 6 + 1)
  const s = reduceAll(initialState(0), [...all, rewound(1, 7, { kept_tokens: [23], kept_pieces: ["d23"] })]);
  assert.deepEqual(statuses(s).slice(-2), ["rejected:22", "kept:23"]);
  const kept = seqSlice(s.tokens).at(-1);
  assert.equal(kept.round, 2);
  assert.equal(kept.pos, 6);
  // round 2 again, from position 7
  const s2 = reduceAll(s, [drafted(2, [24]), verified(2, 6, 8), accepted(2, [24], 31, "bonus", 7), telemetry(2)]);
  assert.deepEqual(statuses(s2).slice(-3), ["kept:23", "accepted:24", "bonus:31"]);
  assert.deepEqual(roundsOf(s2), [1, 2]);
  // a later rewind past the kept tokens keeps them; one before them drops them
  assert.deepEqual(statuses(reduceAll(s2, [rewound(2, 9)])).slice(-3), ["kept:23", "accepted:24", "bonus:31"]);
  assert.deepEqual(statuses(reduceAll(s2, [rewound(0, 3)])), ["prompt:2", "prompt:10", "prompt:11"]);
});

test("a rewind to a finished round is finished again", () => {
  const s = reduceAll(initialState(0), [...session(), rewound(3, 10, { finished: "max_tokens" })]);
  assert.equal(s.finished.reason, "max_tokens");
  assert.equal(s.finished.n_generated, 7);
});
