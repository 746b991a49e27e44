// Every message the page sends to Python, built here and nowhere else (pure functions, no DOM, no host).
//
// The messages' shapes are declared once, in widgets/protocol.json ("to_python"); Python validates each
// one it receives against it (specviz/ui/protocol.py) and the node tests check these builders against it
// (widgets/tests/declaration.test.js), and that no other module writes a message of its own. Numbers typed
// into a field are sent as typed (parsed, not checked): Python refuses what is out of range or not a
// number, and the page shows why.

/** The hello a view sends: the epoch it holds and how many of its events. */
export function helloMessage(state) {
  return { type: "hello", epoch: state.epoch, have: state.n };
}

/** A toolbar command without fields: "step", "play" or "pause". */
export function commandMessage(cmd) {
  return { type: "cmd", cmd };
}

/** Run N rounds, N as typed in the Run field (blank: 1). */
export function runMessage(text) {
  return { type: "cmd", cmd: "run", n: Math.max(1, parseInt(text || "1", 10)) };
}

// a typed number: blank → null (the current generation's value); a non-number (or a fraction for an
// integer) goes to Python as typed, which refuses it
function typedNumber(text) {
  const v = String(text == null ? "" : text).trim();
  if (v === "") return null;
  const x = Number(v);
  return Number.isNaN(x) ? v : x;
}

/** The context settings typed as numbers (the others are chosen by name). */
const SIZE_SETTINGS = ["n_ctx", "n_batch", "n_ubatch", "n_threads"];

/**
 * Reset with the new-session fields as typed: `{prompt, maxTokens, temperature, topK, topP, seed, stops,
 * chat}` (text, except `chat`: a boolean). Stop strings are one a line, `\n` and `\t` written as escapes.
 * `context` (optional) holds the deployment's settings as chosen, `{flash_attn, cache_type_k, cache_type_v,
 * n_ctx, n_batch, n_ubatch, n_threads}`: a blank one is left out (the current setting stays); none at all: no
 * `context` field. `serverArgs` (optional): a whole llama-server command line, sent instead of `context`.
 * `grammar` (GBNF) and `jsonSchema` (JSON text), when the form has them: the grammar is always sent as typed
 * ('' is none); a schema that is not blank is sent instead of it (Python converts and checks both).
 */
export function resetMessage(f) {
  const msg = {
    type: "cmd", cmd: "reset", prompt: f.prompt, max_tokens: parseInt(f.maxTokens || "0", 10) || null,
    temperature: typedNumber(f.temperature), top_k: typedNumber(f.topK), top_p: typedNumber(f.topP), seed: typedNumber(f.seed),
    chat: !!f.chat,
    stop: String(f.stops || "").split("\n").filter((x) => x !== "").map((x) => x.replace(/\\n/g, "\n").replace(/\\t/g, "\t")),
  };
  const schema = String(f.jsonSchema == null ? "" : f.jsonSchema);
  if (schema.trim()) msg.json_schema = schema;
  else if (f.grammar != null) msg.grammar = String(f.grammar);
  const line = String(f.serverArgs || "").trim();
  if (line) {
    msg.server_args = line;
    return msg;
  }
  const context = {};
  for (const [k, v] of Object.entries(f.context || {})) {
    if (v !== "" && v != null) context[k] = SIZE_SETTINGS.includes(k) ? typedNumber(v) : String(v);
  }
  if (Object.keys(context).length) msg.context = context;
  return msg;
}

/** The knob form: a strategy and its knob values as read from the form. */
export function configureMessage(strategy, knobs) {
  return { type: "configure", strategy, knobs };
}

/** Ask for a strategy's knob descriptions. */
export function schemaMessage(strategy) {
  return { type: "schema", strategy };
}

/** Ask for the plotly bundle. */
export function plotlyMessage() {
  return { type: "plotly" };
}

/** Rewind to right after round `round`. */
export function rewindToRound(round) {
  return { type: "rewind", round };
}

/** Rewind to `position` tokens of history. */
export function rewindToPosition(position) {
  return { type: "rewind", position };
}

/** Open the second lane from right after `round`. */
export function branchMessage(round) {
  return { type: "lane", cmd: "branch", round };
}

/** The second lane from the start ("compare") or from its next round ("configure") with a strategy (blank:
 * the current one) and knobs as `name=value, ...` text. */
export function laneSettingMessage(cmd, strategy, knobsText) {
  return { type: "lane", cmd, strategy: strategy || null, knobs: knobsText };
}

/** A lane command without fields: "step", "run" or "close". */
export function laneMessage(cmd) {
  return { type: "lane", cmd };
}

/** The Diagnose button. */
export function diagnoseMessage() {
  return { type: "diagnose" };
}

/** The Advise button. */
export function adviseMessage() {
  return { type: "advise" };
}

/** Start a preset. */
export function presetMessage(name) {
  return { type: "preset", name };
}

/** A download: "snapshot" or "record". */
export function fileMessage(cmd) {
  return { type: "file", cmd };
}

/** Raw bytes per uploaded part (Python accepts parts of up to 1 MiB of base64). */
export const UPLOAD_PART = 512 * 1024;

function bytesToBase64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

/** An uploaded snapshot (a Uint8Array) as its restore parts, in order; `id` names the upload. */
export function restoreMessages(id, bytes) {
  const count = Math.max(1, Math.ceil(bytes.length / UPLOAD_PART));
  const out = [];
  for (let i = 0; i < count; i++) {
    out.push({ type: "file", cmd: "restore", id, index: i, count, data: bytesToBase64(bytes.subarray(i * UPLOAD_PART, (i + 1) * UPLOAD_PART)) });
  }
  return out;
}
