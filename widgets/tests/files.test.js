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
