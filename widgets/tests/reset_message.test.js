// The Reset message's deployment part (messages.js): the context settings as chosen in the new-session
// form, or a whole llama-server command line instead of them.
import assert from "node:assert/strict";
import test from "node:test";

import { resetMessage } from "../inspector/messages.js";

const FORM = { prompt: "p", maxTokens: "16", temperature: "", topK: "", topP: "", seed: "", stops: "", chat: false };

test("no deployment fields: no context and no server line (the current settings stay)", () => {
  const m = resetMessage(FORM);
  assert.ok(!("context" in m) && !("server_args" in m));
  assert.ok(!("context" in resetMessage({ ...FORM, context: { flash_attn: "", n_ctx: "", n_threads: null } })));
});

test("the chosen settings are sent, sizes as numbers, blanks left out", () => {
  const m = resetMessage({ ...FORM, context: { flash_attn: "off", cache_type_k: "q8_0", cache_type_v: "", n_ctx: "8192", n_batch: "1024", n_ubatch: "256", n_threads: "" } });
  assert.deepEqual(m.context, { flash_attn: "off", cache_type_k: "q8_0", n_ctx: 8192, n_batch: 1024, n_ubatch: 256 });
  // a size that is not a number goes as typed (Python refuses it, naming the setting)
  assert.deepEqual(resetMessage({ ...FORM, context: { n_ctx: "lots" } }).context, { n_ctx: "lots" });
});

test("a llama-server line is sent instead of the fields, trimmed", () => {
  const m = resetMessage({ ...FORM, context: { flash_attn: "off", n_ctx: "512" }, serverArgs: "  llama-server -fa on --spec-type ngram-mod \n" });
  assert.equal(m.server_args, "llama-server -fa on --spec-type ngram-mod");
  assert.ok(!("context" in m));
  assert.ok(!("server_args" in resetMessage({ ...FORM, serverArgs: "   " })));
});
