// The events-message protocol: apply only what is new, ask again on a gap, start over on a new epoch.
import assert from "node:assert/strict";
import test from "node:test";

import { helloMessage } from "../inspector/messages.js";
import { planEvents, stateIsStale } from "../inspector/protocol.js";
import { initialState, reduceAll } from "../inspector/state.js";
import { session } from "./events.js";

const evs = session();
const holding = (n, epoch = 0) => reduceAll(initialState(epoch), evs.slice(0, n));

test("hello says which epoch the view holds and how many of its events", () => {
  assert.deepEqual(helloMessage(initialState()), { type: "hello", epoch: -1, have: 0 });
  assert.deepEqual(helloMessage(holding(5, 2)), { type: "hello", epoch: 2, have: 5 });
});

test("a first message of an epoch starts from an empty state", () => {
  const p = planEvents(initialState(), { type: "events", epoch: 0, start: 0, events: evs });
  assert.deepEqual(p, { ask: false, reset: true, events: evs });
});

test("only events the view does not hold are applied", () => {
  assert.deepEqual(planEvents(holding(5), { epoch: 0, start: 5, events: evs.slice(5) }).events, evs.slice(5));
  assert.deepEqual(planEvents(holding(5), { epoch: 0, start: 3, events: evs.slice(3) }).events, evs.slice(5), "overlap");
  assert.deepEqual(planEvents(holding(5), { epoch: 0, start: 0, events: evs.slice(0, 5) }).events, [], "a repeat");
  assert.equal(planEvents(holding(5), { epoch: 0, start: 5, events: [] }).reset, false);
});

test("a gap, or a later part of another epoch, makes the view ask again", () => {
  assert.deepEqual(planEvents(holding(5), { epoch: 0, start: 7, events: evs.slice(7) }), { ask: true });
  assert.deepEqual(planEvents(holding(5), { epoch: 1, start: 3, events: evs.slice(3) }), { ask: true });
  assert.deepEqual(planEvents(initialState(), { epoch: 0, start: 2, events: evs.slice(2) }), { ask: true });
});

test("a new epoch from its start replaces what the view holds", () => {
  const p = planEvents(holding(9), { epoch: 1, start: 0, events: evs.slice(0, 2) });
  assert.deepEqual(p, { ask: false, reset: true, events: evs.slice(0, 2) });
});

test("a malformed events message is refused with a reason", () => {
  for (const bad of [{}, { epoch: "0", start: 0, events: [] }, { epoch: 0, start: -1, events: [] }, { epoch: 0, start: 1.5, events: [] },
    { epoch: 0, start: 0, events: {} }, { epoch: 0, start: 0 }]) {
    assert.match(planEvents(holding(3), bad).error, /malformed events message/, JSON.stringify(bad));
  }
});

test("a packed message holds several messages in order; a malformed one is refused", async () => {
  const { unpackMessages } = await import("../inspector/protocol.js");
  const msgs = [{ type: "events", epoch: 0, start: 0, events: [] }, { type: "state", running: true }];
  assert.deepEqual(unpackMessages({ type: "packed", json: JSON.stringify(msgs) }), { messages: msgs });
  assert.ok(unpackMessages({ type: "packed", json: "{not json" }).error);
  assert.ok(unpackMessages({ type: "packed", json: JSON.stringify({ type: "state" }) }).error);
  assert.ok(unpackMessages({ type: "packed" }).error);
  // nothing nests, nothing that is not a message passes
  assert.deepEqual(unpackMessages({ type: "packed", json: JSON.stringify([null, 3, { type: "packed", json: "[]" }]) }),
    { messages: [] });
});

test("a state older than the newest applied is stale; one without a seq never is", () => {
  assert.equal(stateIsStale(-1, { type: "state", seq: 0 }), false);
  assert.equal(stateIsStale(5, { type: "state", seq: 6 }), false);
  assert.equal(stateIsStale(5, { type: "state", seq: 5 }), false); // the same state again (a hello's reply)
  assert.equal(stateIsStale(5, { type: "state", seq: 4 }), true);
  assert.equal(stateIsStale(5, { type: "state" }), false);
});
