// The controls: the toolbar (Step, Run N, Play/Pause, Reset, the legend and the rejected-token toggle)
// and the card with the strategy, its knob form, Apply and the prompt for a new session. Every button
// sends a message to Python; what they allow follows the host's "state" messages (`config`).

import { strategyOptions } from "../block.js";
import { h } from "../dom.js";
import { commandMessage, configureMessage, resetMessage, runMessage, schemaMessage } from "../messages.js";
import { buildKnobForm, readKnobForm, showKnobErrors } from "./knob_form.js";
import { FORCED_CLASS, FORCED_TITLE } from "./token_class.js";

/**
 * `{toolbar, card, config, applyState(msg) → bool, schema(msg), knobErrors(msg), event(ev)}`.
 * `send(msg)` sends to the host; `root` gets the class that hides rejected tokens; `uid` is unique per view.
 * `applyState` returns true when the strategy or its knobs changed.
 */
export function controlsView(send, root, uid) {
  const config = { running: false, finished: null, replay: false, strategies: [], strategy: "", knobs: {}, schema: [], draft_models: [] };
  let formStrategy = null; // strategy whose schema the form shows

  // ---- toolbar
  const btnStep = h("button", { class: "sv-btn sv-step", title: "Run one draft/verify round" }, "Step");
  const runN = h("input", { class: "sv-runn", type: "number", min: "1", max: "100000", value: "8", title: "rounds for Run" });
  const btnRun = h("button", { class: "sv-btn sv-run", title: "Run N rounds" }, "Run");
  const btnPlay = h("button", { class: "sv-btn sv-primary sv-play", title: "Play until finished; Pause stops after the current round" }, "▶ Play");
  const btnReset = h("button", { class: "sv-btn sv-reset", title: "Start the session again" }, "↺ Reset");
  const showRej = h("input", { type: "checkbox", class: "sv-showrej", checked: true });
  // shown while the generation has a grammar (its session_started says so)
  const forcedKey = h("span", { class: "sv-tok sv-acc " + FORCED_CLASS + " sv-legend-forced", text: "forced", hidden: true,
    title: FORCED_TITLE + ": the only token it allowed there (dotted underline)" });
  const legend = h("div", { class: "sv-legend" },
    h("span", { class: "sv-tok sv-prompt", text: "prompt" }),
    h("span", { class: "sv-tok sv-acc", text: "accepted" }),
    h("span", { class: "sv-tok sv-bonus", text: "bonus" }),
    h("span", { class: "sv-tok sv-corr", text: "correction" }),
    h("span", { class: "sv-tok sv-plain", text: "target" }),
    h("span", { class: "sv-tok sv-rej", text: "rejected" }),
    forcedKey,
    h("label", { class: "sv-check" }, showRej, " rejected"));
  const toolbar = h("div", { class: "sv-toolbar" },
    btnStep, h("span", { class: "sv-runwrap" }, btnRun, runN), btnPlay, btnReset, h("span", { class: "sv-grow" }), legend);

  // ---- strategy, knobs, new session
  const stratSel = h("select", { class: "sv-strategy" });
  const stratErr = h("div", { class: "sv-field-err" });
  const form = h("div", { class: "sv-form" });
  const formNote = h("div", { class: "sv-form-note" });
  const btnApply = h("button", { class: "sv-btn sv-primary sv-apply" }, "Apply at next round");
  const sessionFields = h("details", { class: "sv-newsession" }, h("summary", { text: "New session (used by Reset)" }));
  const deploymentView = deploymentFields();
  const promptBox = h("textarea", { class: "sv-prompt-input", rows: "3" });
  const maxTok = h("input", { class: "sv-maxtok", type: "number", min: "1", value: "128" });
  // sampling and the request's form, passed on by Reset (blank: the current generation's value)
  const temp = h("input", { class: "sv-temp", type: "text", inputmode: "decimal", placeholder: "0 = greedy", title: "temperature (0: greedy, exact)" });
  const topK = h("input", { class: "sv-topk", type: "text", inputmode: "numeric", placeholder: "0 = off", title: "top-k (0: off)" });
  const topP = h("input", { class: "sv-topp", type: "text", inputmode: "decimal", placeholder: "1 = off", title: "top-p (1: off)" });
  const seed = h("input", { class: "sv-seed", type: "text", inputmode: "numeric", placeholder: "random", title: "seed of the sampling generator" });
  const stops = h("textarea", { class: "sv-stops", rows: "2", placeholder: "one stop string per line (\\n for a newline)",
    title: "stop strings: the output ends before the first one, as plain decoding's would" });
  const chat = h("input", { type: "checkbox", class: "sv-chat" });
  const grammarView = grammarFields();
  const sampling = h("div", { class: "sv-sampling" },
    h("label", { class: "sv-lbl", text: "temperature" }), temp, h("label", { class: "sv-lbl", text: "top-k" }), topK,
    h("label", { class: "sv-lbl", text: "top-p" }), topP, h("label", { class: "sv-lbl", text: "seed" }), seed);
  sessionFields.append(h("label", { class: "sv-lbl", text: "prompt" }), promptBox, h("label", { class: "sv-lbl", text: "max tokens" }), maxTok,
    sampling, h("label", { class: "sv-lbl", text: "stop strings" }), stops,
    h("label", { class: "sv-check sv-chat-lbl", title: "send the prompt as a user message through the model's own chat template" }, chat,
      " chat (the model's template)"), grammarView.el, deploymentView.el);
  const card = h("div", { class: "sv-card sv-ctrl-card" },
    h("div", { class: "sv-card-h" }, h("span", { text: "Strategy & knobs" })),
    h("div", { class: "sv-field sv-field-strategy" }, h("label", { class: "sv-lbl", text: "strategy" }), stratSel, stratErr),
    form, h("div", { class: "sv-apply-row" }, btnApply), formNote, sessionFields);

  // The numbers are sent as typed (parsed, but not checked): Python validates every message and shows
  // what it refuses (messages.js builds every message).
  btnStep.addEventListener("click", () => send(commandMessage("step")));
  btnRun.addEventListener("click", () => send(runMessage(runN.value)));
  btnPlay.addEventListener("click", () => send(commandMessage(config.running ? "pause" : "play")));
  btnReset.addEventListener("click", () => send(resetMessage({ prompt: promptBox.value, maxTokens: maxTok.value, temperature: temp.value,
    topK: topK.value, topP: topP.value, seed: seed.value, stops: stops.value, chat: chat.checked, ...grammarView.read(), ...deploymentView.read() })));
  showRej.addEventListener("change", () => root.classList.toggle("sv-hide-rej", !showRej.checked));
  stratSel.addEventListener("change", () => {
    stratErr.textContent = "";
    send(schemaMessage(stratSel.value));
  });
  btnApply.addEventListener("click", () => {
    const knobs = readKnobForm(form);
    stratErr.textContent = "";
    formNote.textContent = "";
    send(configureMessage(stratSel.value, knobs));
  });

  function buildForm(strategy, schema, values) {
    formStrategy = strategy;
    buildKnobForm(form, schema || [], values, config.draft_models || [], uid);
    syncDisabled();
  }

  function syncDisabled() {
    // while a heavy message works in the background the page's other commands would be refused: disable them
    const working = !!config.working;
    const ro = config.replay || !config.can_control || working;
    const busy = config.running;
    const done = !!config.finished;
    btnStep.disabled = busy || working || done || !config.can_step;
    btnRun.disabled = busy || working || done || !config.can_step;
    btnPlay.disabled = working || (!busy && (done || !config.can_step));
    btnPlay.textContent = busy ? "❚❚ Pause" : "▶ Play";
    btnPlay.classList.toggle("sv-pausing", busy);
    btnReset.disabled = busy || working || !config.can_reset;
    stratSel.disabled = ro;
    btnApply.disabled = ro;
    for (const i of form.querySelectorAll("input,select")) i.disabled = ro;
    promptBox.disabled = config.replay;
    maxTok.disabled = config.replay;
    for (const i of [temp, topK, topP, seed, stops, chat]) i.disabled = config.replay;
    grammarView.sync(config);
    deploymentView.sync(config);
    sessionFields.hidden = !!config.replay;
    // presenter mode: a viewer watches; every control but the view's own options is the presenter's
    if (config.role === "viewer") {
      for (const c of [...toolbar.querySelectorAll("button,input,select,textarea"), ...card.querySelectorAll("button,input,select,textarea")]) {
        if (!c.classList.contains("sv-showrej")) c.disabled = true;
      }
    }
  }

  function hasOption(name) {
    return Array.from(stratSel.options).some((o) => o.value === name);
  }

  function applyState(st) {
    const prevStrategy = config.strategy;
    const prevKnobs = JSON.stringify(config.knobs);
    Object.assign(config, st);
    if (Array.isArray(st.strategies) || (config.strategy && !hasOption(config.strategy))) {
      // a chain of drafters (started from Python or the CLI) is offered beside the registered strategies
      const names = strategyOptions(config.strategies || [], config.strategy);
      const cur = stratSel.value;
      stratSel.replaceChildren(...names.map((s) => h("option", { value: s, text: s })));
      stratSel.value = cur && names.includes(cur) ? cur : config.strategy;
    }
    const changed = config.strategy !== prevStrategy || JSON.stringify(config.knobs) !== prevKnobs;
    if (config.strategy && (changed || formStrategy === null)) {
      stratSel.value = config.strategy;
      buildForm(config.strategy, config.schema, config.knobs);
    }
    if (st.pending) formNote.textContent = "queued: " + st.pending + " — applies at the next round";
    else if ("pending" in st) formNote.textContent = "";
    if (st.prompt != null && !promptBox.value) promptBox.value = st.prompt;
    if (st.error) formNote.textContent = st.error;
    syncDisabled();
    return changed;
  }

  function schema(msg) {
    if (msg.strategy === stratSel.value) buildForm(msg.strategy, msg.knobs, msg.strategy === config.strategy ? config.knobs : null);
    if (msg.error) stratErr.textContent = msg.error;
  }

  function knobErrors(msg) {
    const errs = msg.errors || {};
    showKnobErrors(form, errs);
    if (errs.strategy) stratErr.textContent = errs.strategy;
    formNote.textContent = msg.general || (Object.keys(errs).length ? "nothing changed" : "");
    formNote.classList.toggle("sv-note-err", Object.keys(errs).length > 0 || !!msg.general);
  }

  // a new session shows its prompt and length in the new-session fields (unless the user typed one)
  function event(ev) {
    if (ev.kind !== "session_started") return;
    const msgs = ev.messages || [];
    const user = msgs.length ? msgs[msgs.length - 1].content : null;
    if (!promptBox.value) promptBox.value = user != null ? user : (ev.prompt_pieces || []).join("");
    maxTok.value = ev.max_tokens || maxTok.value;
    temp.value = ev.temperature != null ? String(ev.temperature) : "";
    topK.value = ev.top_k != null ? String(ev.top_k) : "";
    topP.value = ev.top_p != null ? String(ev.top_p) : "";
    seed.value = ev.temperature > 0 && ev.seed != null ? String(ev.seed) : "";
    stops.value = (ev.stop || []).map((x) => x.replace(/\n/g, "\\n").replace(/\t/g, "\\t")).join("\n");
    chat.checked = msgs.length > 0;
    grammarView.started(ev);
    forcedKey.hidden = !ev.grammar;
  }

  // nothing is enabled before the host's first "state" says what is allowed (a click before it would
  // reach a session that may still be starting)
  syncDisabled();

  return { toolbar, card, config, applyState, schema, knobErrors, event };
}

/**
 * The request's grammar in the new-session form: a GBNF grammar, or a JSON schema that stands instead of it
 * (the grammar field is off while the schema holds text). A new session shows its grammar (a schema's
 * conversion) in the grammar field; one without a grammar empties both. Python checks both with llama.cpp's
 * parser and converter and shows what they refuse. `{el, read() → {grammar, jsonSchema}, sync(config),
 * started(ev)}`.
 */
function grammarFields() {
  const grammar = h("textarea", { class: "sv-grammar", rows: "2", spellcheck: "false", placeholder: 'GBNF, e.g. root ::= "yes" | "no"',
    title: "a GBNF grammar every generated token obeys (llama.cpp's grammar sampler; root rule 'root'); blank: none" });
  const schema = h("textarea", { class: "sv-json-schema", rows: "2", spellcheck: "false", placeholder: '{"type": "object", …}',
    title: "a JSON schema the output obeys, converted to GBNF as llama-server converts -j; given, it stands instead of the grammar" });
  const el = h("div", { class: "sv-grammar-fields" },
    h("label", { class: "sv-lbl", text: "grammar (GBNF)" }), grammar, h("label", { class: "sv-lbl", text: "or JSON schema" }), schema);
  let replay = false;
  const syncGrammar = () => { grammar.disabled = replay || schema.value.trim() !== ""; };
  schema.addEventListener("input", syncGrammar);

  function sync(config) {
    replay = !!config.replay;
    schema.disabled = replay;
    syncGrammar();
  }

  function started(ev) {
    grammar.value = ev.grammar || "";
    if (!ev.grammar) schema.value = "";
    syncGrammar();
  }

  return { el, read: () => ({ grammar: grammar.value, jsonSchema: schema.value }), sync, started };
}

/** The context settings a flag sets, in the order llama.cpp's usage lists them: [setting, flag, title]. */
const SIZES = [
  ["n_ctx", "-c", "context size (-c)"],
  ["n_batch", "-b", "logical batch size (-b)"],
  ["n_ubatch", "-ub", "physical batch size (-ub, at most -b)"],
  ["n_threads", "-t", "threads (-t; blank: every core)"],
];

/**
 * The deployment's part of the new-session form: flash attention, the K and V cache types, the sizes and
 * threads as llama.cpp's flags name them, or a whole llama-server command line instead (then the fields
 * are off: the line sets them). Shown only where the host offers settings (its state's `settings`: a live
 * session of the page's own). `{el, read() → {context, serverArgs}, sync(config)}`; the fields show the
 * session's settings whenever those change (a Reset that made the context anew), and keep what the user
 * chose otherwise.
 */
function deploymentFields() {
  const fa = h("select", { class: "sv-fa", title: "flash attention (-fa)" });
  const ctk = h("select", { class: "sv-ctk", title: "K cache type (-ctk)" });
  const ctv = h("select", { class: "sv-ctv", title: "V cache type (-ctv; a quantized one needs flash attention)" });
  const sizes = Object.fromEntries(SIZES.map(([k, , title]) => [k,
    h("input", { class: "sv-" + k.replace("_", ""), type: "text", inputmode: "numeric", title, placeholder: k === "n_threads" ? "all cores" : "" })]));
  const line = h("input", { class: "sv-server-args", type: "text", spellcheck: "false",
    placeholder: "or a llama-server command line: --spec-type ngram-mod -fa on -ctk q8_0 …",
    title: "a whole llama-server command line: its --spec-* flags, context settings and sampling (flags not honoured are named in a warning)" });
  const grid = h("div", { class: "sv-sampling sv-deploy-grid" },
    h("label", { class: "sv-lbl", text: "-fa" }), fa, h("label", { class: "sv-lbl", text: "-ctk" }), ctk,
    h("label", { class: "sv-lbl", text: "-ctv" }), ctv, h("span"), h("span"),
    ...SIZES.flatMap(([k, flag]) => [h("label", { class: "sv-lbl", text: flag }), sizes[k]]));
  const el = h("div", { class: "sv-deployment", hidden: true },
    h("label", { class: "sv-lbl", text: "deployment (llama.cpp's context settings)" }), grid, line);
  let shown = null; // the settings the fields were last filled from

  const options = (sel, values) => {
    if (JSON.stringify([...sel.options].map((o) => o.value)) === JSON.stringify(values)) return;
    sel.replaceChildren(...values.map((v) => h("option", { value: v, text: v })));
  };
  const fields = () => [fa, ctk, ctv, ...Object.values(sizes)];
  const lineGiven = () => line.value.trim() !== "";

  function sync(config) {
    el.hidden = !config.settings || !!config.replay;
    if (!config.settings) return;
    const choices = config.setting_choices || {};
    options(fa, choices.flash_attn || ["auto", "on", "off"]);
    options(ctk, choices.cache_types || ["f16"]);
    options(ctv, choices.cache_types || ["f16"]);
    const now = JSON.stringify(config.settings);
    if (now !== shown) {
      shown = now;
      const st = config.settings;
      fa.value = st.flash_attn;
      ctk.value = st.cache_type_k;
      ctv.value = st.cache_type_v;
      for (const [k] of SIZES) sizes[k].value = st[k] == null ? "" : String(st[k]);
    }
    for (const f of fields()) f.disabled = !!config.replay || lineGiven();
    line.disabled = !!config.replay;
  }
  line.addEventListener("input", () => { for (const f of fields()) f.disabled = lineGiven(); });

  function read() {
    if (el.hidden) return {};
    if (lineGiven()) return { serverArgs: line.value };
    const context = { flash_attn: fa.value, cache_type_k: ctk.value, cache_type_v: ctv.value };
    for (const [k] of SIZES) context[k] = sizes[k].value;
    return { context };
  }

  return { el, read, sync };
}
