// The page and the protocol declaration (widgets/protocol.json) agree: every message the page sends is
// built by messages.js and matches its declaration, the page has a handler for every message Python
// sends it and none for an undeclared one.
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import test from "node:test";

import * as messages from "../inspector/messages.js";
import { declaration, declaredKinds, kindOf, problems } from "./declared.js";

const SRC = new URL("../inspector/", import.meta.url);
const sources = () => {
  const out = [];
  const walk = (dir, prefix) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      if (e.isDirectory()) walk(new URL(e.name + "/", dir), prefix + e.name + "/");
      else if (e.name.endsWith(".js")) out.push([prefix + e.name, readFileSync(new URL(e.name, dir), "utf-8")]);
    }
  };
  walk(SRC, "");
  return out;
};

// each builder with what the page passes it when the user's input is valid …
const VALID = {
  helloMessage: [[{ epoch: -1, n: 0 }], [{ epoch: 3, n: 120 }]],
  commandMessage: [["step"], ["play"], ["pause"]],
  runMessage: [["8"], [""], ["100000"]],
  resetMessage: [
    [{ prompt: "def f(x):", maxTokens: "128", temperature: "", topK: "", topP: "", seed: "", stops: "", chat: false }],
    [{ prompt: "", maxTokens: "", temperature: "0.8", topK: "40", topP: "0.95", seed: "7", stops: "\\n\\n\nEND", chat: true }],
    [{ prompt: "x", maxTokens: "8", stops: "", chat: false,
      context: { flash_attn: "on", cache_type_k: "q8_0", cache_type_v: "q8_0", n_ctx: "8192", n_batch: "1024", n_ubatch: "256", n_threads: "" } }],
    [{ prompt: "x", maxTokens: "8", stops: "", chat: false, context: { flash_attn: "off" }, serverArgs: " -m m.gguf --spec-type ngram-mod -fa on " }],
  ],
  configureMessage: [["prompt-lookup", { draft_max: "8", align: true }], ["none", {}]],
  schemaMessage: [["ngram-simple"]],
  plotlyMessage: [[]],
  rewindToRound: [[0], [7]],
  rewindToPosition: [[12]],
  branchMessage: [[0], [3]],
  laneSettingMessage: [["compare", "prompt-lookup", "draft_max=4, draft_policy=cost"], ["configure", "", ""]],
  laneMessage: [["step"], ["run"], ["close"]],
  diagnoseMessage: [[]],
  adviseMessage: [[]],
  presetMessage: [["quote"]],
  fileMessage: [["snapshot"], ["record"]],
  restoreMessages: [["u1", new Uint8Array([1, 2, 3])], ["u2", new Uint8Array(2 * messages.UPLOAD_PART + 1)]],
};
// … and what it sends as typed when the input is not valid (Python refuses it; the shape is still declared)
const TYPED = {
  runMessage: [["abc"], ["0"], ["-3"], ["1e12"]],
  resetMessage: [
    [{ prompt: "x", maxTokens: "zero", temperature: "warm", topK: "1.5", topP: "-", seed: "s", stops: "", chat: false }],
    [{ prompt: "x", maxTokens: "8", stops: "", chat: false, context: { n_ctx: "big", flash_attn: "maybe" } }],
  ],
  configureMessage: [["prompt-lookup", { draft_max: "" }]],
};

const built = (cases) => {
  const out = [];
  for (const [name, argLists] of Object.entries(cases)) {
    for (const args of argLists) {
      const r = messages[name](...args);
      for (const m of Array.isArray(r) ? r : [r]) out.push([name, args, JSON.parse(JSON.stringify(m))]); // as sent: JSON
    }
  }
  return out;
};

test("every message builder is checked here", () => {
  const builders = Object.entries(messages).filter(([, v]) => typeof v === "function").map(([k]) => k).sort();
  assert.deepEqual(Object.keys(VALID).sort(), builders);
});

test("what the page sends on valid input matches the declaration exactly", () => {
  for (const [name, args, msg] of built(VALID)) {
    assert.deepEqual(problems("to_python", msg), [], name + "(" + JSON.stringify(args) + ") → " + JSON.stringify(msg).slice(0, 200));
  }
});

test("what the page sends as typed has the declared fields (Python checks the values)", () => {
  for (const [name, args, msg] of built(TYPED)) {
    assert.deepEqual(problems("to_python", msg, { shapeOnly: true }), [], name + "(" + JSON.stringify(args) + ")");
  }
});

test("the page can send every message the declaration has", () => {
  const sent = new Set(built(VALID).map(([, , m]) => kindOf("to_python", m)));
  assert.deepEqual([...sent].sort(), declaredKinds("to_python").sort());
});

test("the checker refuses what the declaration does not allow", () => {
  // the checker is what the tests above rely on: each of these must be a problem
  for (const bad of [{ type: "explode" }, { type: "cmd", cmd: "jump" }, { type: "cmd", cmd: "run", n: 0 }, { type: "cmd", cmd: "run", n: 1.5 },
    { type: "hello", epoch: 0 }, { type: "hello", epoch: 0, have: 0, extra: 1 }, { type: "rewind" }, { type: "rewind", round: 1, position: 2 },
    { type: "cmd", cmd: "reset", stop: [1] }, { type: "file", cmd: "restore", id: "", index: 0, count: 1, data: "" },
    { type: "configure", knobs: [] }, { type: "lane", cmd: "compare", knobs: 3 }]) {
    assert.notDeepEqual(problems("to_python", bad), [], JSON.stringify(bad));
  }
});

test("no module but messages.js writes a message of its own", () => {
  const types = Object.keys(declaration.to_python).join("|");
  // a message literal: { type: "cmd", … } (an element's attributes, h("input", { type: "file" … }), are not one)
  const literal = new RegExp(`(?<!h\\("input",\\s*)\\{\\s*type:\\s*"(${types})"`);
  const files = sources();
  assert.ok(files.some(([p]) => p === "views/controls.js"), "the sources were found");
  for (const [path, text] of files) {
    if (path === "messages.js") continue;
    assert.doesNotMatch(text, /\bsend(_msg)?\(\s*\{/, path + ": a message written in place; build it in messages.js");
    assert.doesNotMatch(text, literal, path + ": a message written in place; build it in messages.js");
  }
});

test("the page handles every message Python sends it, and no other", () => {
  const index = readFileSync(new URL("index.js", SRC), "utf-8");
  const body = index.slice(index.indexOf("function onMsg("), index.indexOf("host.on(onMsg)"));
  const handled = [...body.matchAll(/case "(\w+)":/g)].map((m) => m[1]).sort();
  assert.deepEqual(handled, Object.keys(declaration.to_page).sort());
});

test("the page's own bounds agree with the declaration", () => {
  const controls = readFileSync(new URL("views/controls.js", SRC), "utf-8");
  const runMax = controls.match(/class: "sv-runn"[^}]*max: "(\d+)"/);
  assert.ok(runMax, "the Run field has a maximum");
  assert.equal(Number(runMax[1]), declaration.to_python.cmd.variants.run.fields.n.max);
  const restore = declaration.to_python.file.variants.restore.fields;
  assert.ok(Math.ceil(messages.UPLOAD_PART / 3) * 4 <= restore.data.max_length, "a part's base64 fits the declared size");
});
