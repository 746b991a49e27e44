// Downloads arrive in base64 parts: collectPart assembles them in order, whatever order they come in.
import assert from "node:assert/strict";
import test from "node:test";

import { collectPart } from "../inspector/views/files.js";

test("parts are collected until the last one", () => {
  const pending = new Map();
  const part = (index, data) => ({ id: "f1", name: "s.bin", mime: "application/octet-stream", index, count: 3, data });
  assert.deepEqual(collectPart(pending, part(1, "Qg==")), { done: false });
  assert.deepEqual(collectPart(pending, part(0, "QQ==")), { done: false });
  assert.deepEqual(collectPart(pending, part(0, "QQ==")), { done: false }); // a repeated part counts once
  const r = collectPart(pending, part(2, "Qw=="));
  assert.equal(r.done, true);
  assert.deepEqual(r.parts, ["QQ==", "Qg==", "Qw=="]);
  assert.equal(r.name, "s.bin");
  assert.equal(pending.size, 0);
});

test("a malformed part is refused", () => {
  const pending = new Map();
  assert.ok(collectPart(pending, { id: "x", index: 3, count: 2, data: "" }).error);
  assert.ok(collectPart(pending, { id: 5, index: 0, count: 1, data: "" }).error);
  assert.equal(pending.size, 0);
});

test("an upload sends each part when the previous one is acknowledged, and ends on done or error", async () => {
  const { nextUploadStep } = await import("../inspector/views/files.js");
  const pending = new Map([["u1", { parts: ["p0", "p1", "p2"], name: "s.bin" }]]);
  assert.deepEqual(nextUploadStep(pending, { type: "upload", id: "u1", next: 1, count: 3 }), { send: "p1", delay: 0 });
  // the server's gate asked the page to slow down: the same part again, later
  assert.deepEqual(nextUploadStep(pending, { type: "upload", id: "u1", next: 1, count: 3, retry_ms: 750 }), { send: "p1", delay: 750 });
  assert.deepEqual(nextUploadStep(pending, { type: "upload", id: "other", next: 0, count: 1 }), {}, "not ours");
  assert.deepEqual(nextUploadStep(pending, { type: "upload", id: "u1", next: 3, count: 3 }), { done: "s.bin" });
  assert.equal(pending.size, 0);
  pending.set("u2", { parts: ["p0"], name: "t.bin" });
  assert.deepEqual(nextUploadStep(pending, { type: "upload", id: "u2", next: 0, count: 1, error: "too large" }), { error: "too large", name: "t.bin" });
  assert.equal(pending.size, 0);
});
