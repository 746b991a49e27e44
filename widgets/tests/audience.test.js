// Presenter mode's banner text: which role this page has and how many pages watch.
import assert from "node:assert/strict";
import test from "node:test";

import { audienceText } from "../inspector/views/audience.js";

test("no role (a page with its own session): no banner", () => {
  assert.equal(audienceText({ type: "state", can_control: true }), "");
  assert.equal(audienceText(null), "");
  assert.equal(audienceText({ role: "someone" }), "");
});

test("the presenter and a viewer see their role and the audience", () => {
  const p = audienceText({ role: "presenter", audience: { presenters: 1, viewers: 3 } });
  assert.match(p, /^Presenting/);
  assert.match(p, /3 pages watching/);
  const v = audienceText({ role: "viewer", audience: { presenters: 1, viewers: 1 } });
  assert.match(v, /^Watching the presenter's session/);
  assert.match(v, /1 page watching/);
  assert.match(audienceText({ role: "viewer", audience: { viewers: "x" } }), /0 pages watching/);
});
