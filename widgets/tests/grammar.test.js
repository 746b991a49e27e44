// Structured output in the front-end: the tokens a grammar forced are marked by the reducer (from the accepted
// event's `forced` indexes), classed and described as forced; the new-session form's grammar and JSON schema
// travel in the Reset message. No DOM.
import assert from "node:assert/strict";
import test from "node:test";

import { resetMessage } from "../inspector/messages.js";
import { seqSlice } from "../inspector/seq.js";
import { initialState, reduceAll } from "../inspector/state.js";
import { describeToken } from "../inspector/views/detail.js";
import { FORCED_CLASS, FORCED_TITLE, tokenClass } from "../inspector/views/token_class.js";
import { accepted, drafted, rejected, rewound, started, telemetry, verified } from "./events.js";

const GBNF = 'root ::= "{" [a-z]+ "}"';

function grammarSession() {
  return [
    started({ grammar: GBNF }),
    // round 1: draft [20, 21, 22]: 20 and 21 accepted (20 forced), 22 rejected, correction 30 (forced)
    drafted(1, [20, 21, 22]), verified(1, 2, 6), accepted(1, [20, 21], 30, "correction", 3, { forced: [0, 2] }),
    rejected(1, 2, [22], 30), telemetry(1),
    // round 2: no draft, a plain token the grammar did not force
    drafted(2, []), verified(2, 5, 6), accepted(2, [], 31, "plain", 6, { forced: [] }), telemetry(2),
  ];
}

test("the reducer marks the committed tokens the grammar forced, and only those", () => {
  const s = reduceAll(initialState(0), grammarSession());
  const gen = seqSlice(s.tokens).filter((t) => t.status !== "prompt");
  assert.deepEqual(gen.map((t) => [t.id, t.status, !!t.forced]),
    [[20, "accepted", true], [21, "accepted", false], [30, "correction", true], [22, "rejected", false], [31, "plain", false]]);
  assert.equal(seqSlice(s.tokens).filter((t) => t.forced).length, 2);
});

test("events without `forced` (no grammar, older recordings) mark nothing", () => {
  const s = reduceAll(initialState(0), [started(), drafted(1, [20]), verified(1, 2, 4), accepted(1, [20], 30, "bonus", 3), telemetry(1)]);
  assert.ok(seqSlice(s.tokens).every((t) => !t.forced));
});

test("a forced token keeps its status's class and gains the forced class; the detail says why", () => {
  assert.equal(tokenClass({ status: "accepted", forced: true }), "sv-acc " + FORCED_CLASS);
  assert.equal(tokenClass({ status: "correction", forced: true }), "sv-corr " + FORCED_CLASS);
  assert.equal(tokenClass({ status: "accepted" }), "sv-acc");
  const s = reduceAll(initialState(0), grammarSession());
  const [forced, free] = seqSlice(s.tokens).filter((t) => t.status === "accepted");
  assert.ok(describeToken(forced).some(([k, v]) => k === "grammar" && v.startsWith(FORCED_TITLE)));
  assert.ok(!describeToken(free).some(([k]) => k === "grammar"));
  assert.equal(FORCED_TITLE, "forced by the grammar");
});

test("a rewind keeps the marks of the rounds it keeps", () => {
  const events = grammarSession();
  const s = reduceAll(initialState(0), [...events, rewound(1, 6, { from_round: 2, from_position: 7 })]);
  assert.deepEqual(seqSlice(s.tokens).filter((t) => t.forced).map((t) => t.id), [20, 30]);
});

const FORM = { prompt: "p", maxTokens: "16", temperature: "", topK: "", topP: "", seed: "", stops: "", chat: false };

test("Reset sends the grammar as typed ('' is none), or a schema that is not blank instead of it", () => {
  assert.equal(resetMessage({ ...FORM, grammar: GBNF, jsonSchema: "" }).grammar, GBNF);
  assert.ok(!("json_schema" in resetMessage({ ...FORM, grammar: GBNF, jsonSchema: "  \n" })));
  assert.equal(resetMessage({ ...FORM, grammar: "", jsonSchema: "" }).grammar, "");
  const schema = '{"type": "object"}';
  const m = resetMessage({ ...FORM, grammar: GBNF, jsonSchema: schema });
  assert.equal(m.json_schema, schema);
  assert.ok(!("grammar" in m));
  // a form without the fields (an older page) leaves both out: the current generation's grammar stays
  const old = resetMessage(FORM);
  assert.ok(!("grammar" in old) && !("json_schema" in old));
});
