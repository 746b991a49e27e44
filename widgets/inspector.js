// specviz inspector — one front-end module for both hosts.
//
// anywidget (JupyterLab):  render({model, el}) with model.send / model.on("msg:custom")
// Panel JSComponent:       render({model, el}) with model.send_msg / model.on("msg:custom")
//
// Python owns the session; this module only renders the event stream it is sent.  Protocol
// (all messages are plain JSON objects with a "type"):
//   JS → Py  hello {epoch, have}          first message of a view: "I hold `have` events of `epoch`"
//            cmd {cmd, n?, prompt?, max_tokens?}   step | run | play | pause | reset
//            configure {strategy, knobs}  schema {strategy}   plotly {}
//   Py → JS  events {epoch, start, events}  only the events a view does not have yet
//            state {...}  knob_errors {errors, general}  schema {strategy, knobs}
//            plotly {source}  notice {level, text}
// A view applies an "events" message only when start == the number of events it holds; a gap
// (a message it missed) makes it ask again with hello, so Python never resends what a view has.

const CHART_ROUNDS = 60; // per-round charts show the most recent rounds (fewer SVG nodes per redraw)
const KV_ROUNDS = 30;
const CHART_GAP = 90; // ms between two chart redraws (one chart each) while rounds stream in

function hostOf(model) {
  if (typeof model.send_msg === "function") {
    return {
      kind: "panel",
      send: (m) => model.send_msg(m),
      on: (cb) => model.on("msg:custom", cb),
      off: (cb) => { try { model.off("msg:custom", cb); } catch (e) { /* older hosts */ } },
    };
  }
  return {
    kind: "anywidget",
    send: (m) => model.send(m),
    on: (cb) => model.on("msg:custom", cb),
    off: (cb) => model.off("msg:custom", cb),
  };
}

// ---------------------------------------------------------------------------------------------
// small DOM helpers

function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

function fmtP(p) {
  if (p == null || Number.isNaN(p)) return "—";
  return p >= 0.995 ? p.toFixed(3) : p.toFixed(3);
}
function fmtN(x, d = 1) {
  if (x == null || Number.isNaN(x)) return "—";
  return Number(x).toFixed(d);
}

// Token text with whitespace made visible: spaces as "·", tabs as "→", newlines as "↵" + break.
function showPiece(piece) {
  if (piece == null) return "∅";
  if (piece === "") return "∅";
  return piece.replace(/▁/g, " ").replace(/ /g, "·").replace(/\t/g, "→").replace(/\r/g, "␍").replace(/\n/g, "↵");
}
function quote(piece) {
  return "“" + showPiece(piece) + "”";
}

// ---------------------------------------------------------------------------------------------
// plotly: taken from the page if present, otherwise asked once per page from Python (which reads
// the plotly.min.js that the plotly package ships) — never from the network.

function getPlotly(host) {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!window.__specvizPlotly) {
    let resolve;
    const p = new Promise((r) => { resolve = r; });
    p.resolve = resolve;
    window.__specvizPlotly = p;
    host.send({ type: "plotly" });
  } else if (!window.__specvizPlotlyAsked) {
    host.send({ type: "plotly" });
  }
  window.__specvizPlotlyAsked = true;
  return window.__specvizPlotly;
}

function installPlotly(source) {
  if (window.Plotly) return window.Plotly;
  const mod = { exports: {} };
  // The bundle is UMD: given `module` it assigns module.exports and touches no global.
  new Function("module", "exports", source)(mod, mod.exports);
  const P = mod.exports && mod.exports.newPlot ? mod.exports : mod.exports.default;
  window.Plotly = P;
  if (window.__specvizPlotly && window.__specvizPlotly.resolve) window.__specvizPlotly.resolve(P);
  return P;
}

// ---------------------------------------------------------------------------------------------

function render({ model, el }) {
  if (el.__specvizCleanup) el.__specvizCleanup(); // a host may render the same element again
  const host = hostOf(model);
  const uid = Math.random().toString(36).slice(2, 9);
  const S = newState();
  let config = { running: false, finished: null, replay: false, strategies: [], strategy: "", knobs: {}, schema: [] };
  let formStrategy = null; // strategy whose schema the form shows
  let formSchema = [];
  let Plotly = null;
  let chartTimer = null;
  let lastChart = 0;
  let destroyed = false;

  // ---- skeleton -------------------------------------------------------------------------------
  const root = h("div", { class: "specviz-inspector" });
  const title = h("div", { class: "sv-title" }, h("span", { class: "sv-logo", text: "◆" }), h("span", { text: "specviz" }));
  const modelPill = h("span", { class: "sv-pill sv-pill-model", text: "no session" });
  const strategyPill = h("span", { class: "sv-pill sv-pill-strategy", text: "" });
  const statusPill = h("span", { class: "sv-pill sv-status", text: "idle" });
  const header = h("div", { class: "sv-header" }, title, modelPill, strategyPill, h("span", { class: "sv-grow" }), statusPill);

  const btnStep = h("button", { class: "sv-btn sv-step", title: "Run one draft/verify round" }, "Step");
  const runN = h("input", { class: "sv-runn", type: "number", min: "1", max: "100000", value: "8", title: "rounds for Run" });
  const btnRun = h("button", { class: "sv-btn sv-run", title: "Run N rounds" }, "Run");
  const btnPlay = h("button", { class: "sv-btn sv-primary sv-play", title: "Play until finished; Pause stops after the current round" }, "▶ Play");
  const btnReset = h("button", { class: "sv-btn sv-reset", title: "Start the session again" }, "↺ Reset");
  const showRej = h("input", { type: "checkbox", class: "sv-showrej", checked: true });
  const legend = h("div", { class: "sv-legend" },
    h("span", { class: "sv-tok sv-prompt", text: "prompt" }),
    h("span", { class: "sv-tok sv-acc", text: "accepted" }),
    h("span", { class: "sv-tok sv-bonus", text: "bonus" }),
    h("span", { class: "sv-tok sv-corr", text: "correction" }),
    h("span", { class: "sv-tok sv-plain", text: "target" }),
    h("span", { class: "sv-tok sv-rej", text: "rejected" }),
    h("label", { class: "sv-check" }, showRej, " rejected"));
  const toolbar = h("div", { class: "sv-toolbar" },
    btnStep, h("span", { class: "sv-runwrap" }, btnRun, runN), btnPlay, btnReset, h("span", { class: "sv-grow" }), legend);

  // token stream
  const stream = h("div", { class: "sv-stream", tabindex: "0" });
  const detail = h("div", { class: "sv-detail" }, h("span", { class: "sv-muted", text: "Hover a token for its details; click a rejected token for the target's top alternatives." }));
  const finishedBar = h("div", { class: "sv-finished", hidden: true });
  const countEl = h("span", { class: "sv-sub sv-count", text: "" });
  const streamCard = h("div", { class: "sv-card sv-stream-card" },
    h("div", { class: "sv-card-h" }, h("span", { text: "Token stream" }), countEl),
    stream, finishedBar, detail);

  // stats
  const statDefs = [
    ["tps", "tokens/s"], ["acceptance", "acceptance"], ["mal", "mean acc. length"],
    ["generated", "generated"], ["rounds", "rounds"], ["kv", "KV committed"],
  ];
  const statEls = {};
  const extraStats = h("div", { class: "sv-extra-stats", hidden: true });
  const stats = h("div", { class: "sv-stats" }, ...statDefs.map(([k, label]) => {
    const v = h("div", { class: "sv-stat-v", text: "—" });
    statEls[k] = v;
    return h("div", { class: "sv-stat", "data-k": k }, v, h("div", { class: "sv-stat-l", text: label }));
  }), extraStats);

  // controls: strategy + knob form
  const stratSel = h("select", { class: "sv-strategy" });
  const stratErr = h("div", { class: "sv-field-err" });
  const form = h("div", { class: "sv-form" });
  const formNote = h("div", { class: "sv-form-note" });
  const btnApply = h("button", { class: "sv-btn sv-primary sv-apply" }, "Apply at next round");
  const sessionFields = h("details", { class: "sv-newsession" },
    h("summary", { text: "New session (used by Reset)" }));
  const promptBox = h("textarea", { class: "sv-prompt-input", rows: "3" });
  const maxTok = h("input", { class: "sv-maxtok", type: "number", min: "1", value: "128" });
  sessionFields.append(h("label", { class: "sv-lbl", text: "prompt" }), promptBox,
    h("label", { class: "sv-lbl", text: "max tokens" }), maxTok);
  const ctrlCard = h("div", { class: "sv-card sv-ctrl-card" },
    h("div", { class: "sv-card-h" }, h("span", { text: "Strategy & knobs" })),
    h("div", { class: "sv-field sv-field-strategy" }, h("label", { class: "sv-lbl", text: "strategy" }), stratSel, stratErr),
    form, h("div", { class: "sv-apply-row" }, btnApply), formNote, sessionFields);

  const side = h("div", { class: "sv-side" }, stats, ctrlCard);
  const top = h("div", { class: "sv-top" }, streamCard, side);

  // charts: each card has an HTML legend (cheaper and more legible than plotly's) and, when its data
  // is missing, a note in place of the plot.
  const mkChart = (key, cls, label, sub, legendItems) => {
    const box = h("div", { class: "sv-chart " + cls }, h("div", { class: "sv-chart-loading", text: "loading charts…" }));
    const note = h("div", { class: "sv-chart-note", hidden: true });
    const legendEl = h("div", { class: "sv-chart-legend" });
    const subEl = h("span", { class: "sv-sub", text: sub || "" });
    const card = h("div", { class: "sv-card sv-chart-card", "data-chart": key },
      h("div", { class: "sv-card-h" }, h("span", { text: label }), subEl), legendEl, box, note);
    const c = { key, box, note, card, legendEl, subEl, shown: true };
    c.legend = (items) => legendEl.replaceChildren(...items.map(([cls2, text]) =>
      h("span", { class: "sv-lg" }, h("i", { class: "sv-sw " + cls2 }), h("span", { text }))));
    c.legend(legendItems || []);
    c.show = (yes, text) => {
      c.shown = yes;
      box.hidden = !yes;
      note.hidden = yes;
      if (!yes) note.textContent = text || "";
      card.classList.toggle("sv-chart-empty", !yes);
    };
    return c;
  };
  const kvSwa = h("span", { class: "sv-sub sv-swa", text: "" });
  const cKV = mkChart("kv", "sv-kv", "KV cache timeline", "per round: length before the verify → peak → after the rollback, last " + KV_ROUNDS + " rounds",
    [["sv-sw-tc", "target: committed"], ["sv-sw-tr", "target: rolled back"]]);
  cKV.card.querySelector(".sv-card-h").append(kvSwa);
  const cAcc = mkChart("acc", "sv-acc-chart", "Acceptance rate", "per round (last " + CHART_ROUNDS + ") and cumulative",
    [["sv-sw-acc", "this round"], ["sv-sw-line", "cumulative"]]);
  const cHist = mkChart("hist", "sv-hist", "Accepted length", "rounds by tokens committed (bonus/correction included)");
  const cPos = mkChart("pos", "sv-pos", "Per-position acceptance", "share of drafts reaching a depth that were accepted there");
  const cTime = mkChart("time", "sv-time", "Drafting vs verification", "ms per round; tokens/s so far",
    [["sv-sw-draft", "drafting ms"], ["sv-sw-verify", "verification ms"], ["sv-sw-tps", "tokens/s"]]);
  const cConf = mkChart("conf", "sv-conf", "Draft confidence", "acceptance by the drafter's own probability",
    [["sv-sw-acc", "acceptance in bucket"], ["sv-sw-tries", "draft tokens"], ["sv-sw-pmin", "draft_p_min"]]);
  const cTpr = mkChart("tpr", "sv-tpr", "Tokens per round", "committed per round; policy's expectation",
    [["sv-sw-verify", "realised"], ["sv-sw-line", "realised (mean)"], ["sv-sw-exp", "expected (cost policy)"]]);
  const chartList = [cKV, cAcc, cHist, cPos, cTime, cConf, cTpr];
  const charts = h("div", { class: "sv-charts" }, ...chartList.map((c) => c.card));

  const tip = h("div", { class: "sv-tip", hidden: true });
  root.append(header, toolbar, top, charts, tip);
  el.append(root);
  if (document.body && document.body.dataset && document.body.dataset.jpThemeLight === "false") root.classList.add("sv-dark");

  // ---- state ----------------------------------------------------------------------------------
  function newState() {
    return {
      epoch: -1, n: 0, started: null, toks: [], rounds: [], cur: null, tel: null, finished: null,
      hist: [], posAcc: [], rejGroups: 0, hasDraftKV: false, hasExpected: false, expSum: 0, expN: 0,
    };
  }

  function clearViews() {
    const epoch = S.epoch;
    Object.assign(S, newState());
    S.epoch = epoch;
    stream.replaceChildren();
    chunk = null;
    follow = true;
    detail.replaceChildren(h("span", { class: "sv-muted", text: "Hover a token for its details; click a rejected token for the target's top alternatives." }));
    finishedBar.hidden = true;
    for (const k in statEls) statEls[k].textContent = "—";
    scheduleCharts();
  }

  // ---- event application ----------------------------------------------------------------------
  // Follow the newest tokens unless the user scrolled up; decided on scroll, applied once per frame,
  // so an append never forces a synchronous layout of the whole stream.
  let follow = true;
  let scrollQueued = false;
  stream.addEventListener("scroll", () => {
    if (!scrollQueued) follow = stream.scrollHeight - stream.scrollTop - stream.clientHeight < 24;
  });
  function queueScroll() {
    if (!follow || scrollQueued) return;
    scrollQueued = true;
    requestAnimationFrame(() => { stream.scrollTop = stream.scrollHeight; scrollQueued = false; });
  }
  // The stream is split into block chunks so that appending a round re-lays out only the last chunk
  // (one huge inline paragraph costs a full reflow per append); off-screen chunks skip rendering.
  const CHUNK_TOKENS = 300, CHUNK_MAX = 1200;
  let chunk = null, chunkTokens = 0;
  function sink() {
    if (!chunk) { chunk = h("div", { class: "sv-chunk" }); stream.append(chunk); chunkTokens = 0; }
    return chunk;
  }
  function maybeCloseChunk(lastPiece) {
    if (chunkTokens >= CHUNK_MAX || (chunkTokens >= CHUNK_TOKENS && lastPiece && lastPiece.endsWith("\n"))) chunk = null;
  }

  function tokSpan(t) {
    const i = S.toks.length;
    S.toks.push(t);
    chunkTokens += 1;
    const s = document.createElement("span");
    s.className = "sv-tok " + t.cls;
    s.dataset.i = i;
    const txt = showPiece(t.piece);
    s.textContent = txt;
    if (t.piece && t.piece.includes("\n") && t.cls !== "sv-rej") {
      const f = document.createDocumentFragment();
      f.append(s);
      for (let k = 0; k < (t.piece.match(/\n/g) || []).length; k++) f.append(document.createElement("br"));
      return f;
    }
    return s;
  }

  function applyEvent(ev) {
    switch (ev.kind) {
      case "session_started": {
        clearViews();
        S.started = ev;
        const frag = document.createDocumentFragment();
        const toks = ev.prompt_tokens || [], pieces = ev.prompt_pieces || [];
        for (let i = 0; i < toks.length; i++) {
          frag.append(tokSpan({ cls: "sv-prompt", id: toks[i], piece: pieces[i], round: 0, pos: i }));
        }
        sink().append(frag);
        maybeCloseChunk(pieces[pieces.length - 1]);
        modelPill.textContent = basename(ev.model) + (ev.draft_model ? " + " + basename(ev.draft_model) : "");
        strategyPill.textContent = ev.strategy;
        kvSwa.textContent = ev.n_swa > 0 ? "sliding window " + ev.n_swa : "";
        if (!promptBox.value) promptBox.value = pieces.join("");
        maxTok.value = ev.max_tokens || maxTok.value;
        break;
      }
      case "knobs_changed": {
        sink().append(h("span", { class: "sv-knobmark", title: knobText(ev.knobs), text: "⚙ " + ev.strategy }));
        strategyPill.textContent = ev.strategy;
        if (S.started) {
          const dm = ev.strategy === "draft" && ev.knobs ? ev.knobs.draft_model : null;
          modelPill.textContent = basename(S.started.model) + (dm ? " + " + basename(dm) : "");
        }
        break;
      }
      case "draft_proposed":
        S.cur = { round: ev.round, draft: ev, verified: null, accepted: null, rejected: null, rb: {}, tel: null };
        break;
      case "verified":
        ensureCur(ev).verified = ev;
        break;
      case "accepted": {
        const c = ensureCur(ev);
        c.accepted = ev;
        const frag = document.createDocumentFragment();
        const wrap = document.createElement("span");
        wrap.className = "sv-r";
        wrap.dataset.round = ev.round;
        const pieces = ev.pieces || [], toks = ev.tokens || [];
        for (let j = 0; j < ev.n_accepted; j++) {
          wrap.append(tokSpan({ cls: "sv-acc", id: toks[j], piece: pieces[j], round: ev.round, depth: j,
            dp: (ev.draft_probs || [])[j], tp: (ev.target_probs || [])[j], pos: ev.position + j }));
        }
        if (ev.bonus_token != null) {
          const cls = ev.bonus_kind === "correction" ? "sv-corr" : ev.bonus_kind === "bonus" ? "sv-bonus" : "sv-plain";
          wrap.append(tokSpan({ cls, id: ev.bonus_token, piece: ev.bonus_piece, round: ev.round, depth: ev.n_accepted,
            tp: ev.bonus_prob, kind: ev.bonus_kind, pos: ev.position + ev.n_accepted }));
        }
        c.wrap = wrap;
        frag.append(wrap);
        sink().append(frag);
        c.lastPiece = ev.bonus_token != null ? ev.bonus_piece : pieces[pieces.length - 1];
        break;
      }
      case "rejected": {
        const c = ensureCur(ev);
        c.rejected = ev;
        const g = document.createElement("span");
        g.className = "sv-rejg";
        const n = (ev.tokens || []).length;
        const tgl = h("span", { class: "sv-rejtgl", title: "collapse/expand the rejected draft tokens", text: "✕" + n });
        g.append(tgl);
        const inner = document.createElement("span");
        inner.className = "sv-rejin";
        for (let j = 0; j < n; j++) {
          inner.append(tokSpan({ cls: "sv-rej", id: ev.tokens[j], piece: (ev.pieces || [])[j], round: ev.round,
            depth: ev.depth + j, dp: (ev.draft_probs || [])[j], tp: j === 0 ? ev.draft_token_target_prob : null,
            rej: ev, first: j === 0 }));
        }
        g.append(inner);
        (c.wrap || sink()).append(g);
        break;
      }
      case "kv_rollback":
        ensureCur(ev).rb[ev.context] = ev;
        break;
      case "telemetry": {
        const c = ensureCur(ev);
        c.tel = ev.data || {};
        S.tel = c.tel;
        finishRound(c);
        S.cur = null;
        break;
      }
      case "finished":
        if (S.cur && S.cur.accepted) { finishRound(S.cur); S.cur = null; }
        S.finished = ev;
        finishedBar.hidden = false;
        finishedBar.textContent = "finished: " + ev.reason + " · " + ev.n_generated + " tokens" + (ev.message ? " · " + ev.message : "");
        break;
      default:
        break;
    }
  }

  function ensureCur(ev) {
    if (!S.cur || S.cur.round !== ev.round) {
      S.cur = { round: ev.round, draft: null, verified: null, accepted: null, rejected: null, rb: {}, tel: null };
    }
    return S.cur;
  }

  function finishRound(c) {
    const d = c.draft, v = c.verified, a = c.accepted;
    const drafted = d ? (d.tokens || []).length : 0;
    const nacc = a ? a.n_accepted : 0;
    const committed = a ? (a.tokens || []).length : 0;
    const peak = v ? v.kv_peak : null;
    const before = v ? v.kv_before : null;
    const after = c.rb.target ? c.rb.target.to_pos : (c.tel && c.tel.kv != null ? c.tel.kv : peak);
    const r = {
      round: c.round, drafted, nacc, committed,
      rate: drafted > 0 ? nacc / drafted : null,
      cum: c.tel ? c.tel.acceptance_rate : null,
      draftMs: d ? d.seconds * 1000 : 0, verifyMs: v ? v.seconds * 1000 : 0,
      tps: c.tel ? c.tel.tokens_per_second : null, tpr: c.tel ? c.tel.tokens_per_round : null,
      before, peak, after, rbT: c.rb.target || null, rbD: c.rb.draft || null,
      dBefore: v && v.draft_kv_before != null ? v.draft_kv_before : null,
      dPeak: v && v.draft_kv_peak != null ? v.draft_kv_peak : null,
      expected: d && d.expected_tokens != null ? d.expected_tokens : null,
      policy: d ? d.policy : null,
    };
    r.dAfter = c.rb.draft ? c.rb.draft.to_pos : r.dPeak;
    if (r.dBefore != null) S.hasDraftKV = true;
    if (r.expected != null) { S.hasExpected = true; S.expSum += r.expected; S.expN += 1; }
    r.expMean = S.expN ? S.expSum / S.expN : null;
    S.rounds.push(r);
    maybeCloseChunk(c.lastPiece);
    S.hist[committed] = (S.hist[committed] || 0) + 1;
    if (c.tel && c.tel.per_position_acceptance) { S.posAcc = c.tel.per_position_acceptance; S.posTries = c.tel.per_position_tries || []; }
    updateStats();
    scheduleCharts();
  }

  function updateStats() {
    const t = S.tel || {};
    statEls.tps.textContent = fmtN(t.tokens_per_second, 1);
    statEls.acceptance.textContent = t.acceptance_rate == null ? "—" : (100 * t.acceptance_rate).toFixed(1) + "%";
    statEls.mal.textContent = fmtN(t.mean_accepted_length, 2);
    statEls.generated.textContent = t.n_generated == null ? "—" : String(t.n_generated);
    statEls.rounds.textContent = t.rounds == null ? String(S.rounds.length) : String(t.rounds);
    statEls.kv.textContent = t.kv == null ? "—" : String(t.kv);
    const dm = t.draft_model_tokens_per_second;
    const cost = t.policy && t.policy.name === "cost" && t.policy.acceptance_by_run_position ? t.policy : null;
    extraStats.hidden = dm == null && t.expected_tokens_per_round == null && !cost;
    extraStats.replaceChildren(
      ...(dm != null ? [h("span", null, h("b", { text: fmtN(dm, 0) }), " draft-model tok/s"),
        h("span", null, h("b", { text: fmtN(t.draft_model_seconds, 2) + " s" }), " in the draft model")] : []),
      ...(t.expected_tokens_per_round != null ? [h("span", null, h("b", { text: fmtN(t.expected_tokens_per_round, 2) }),
        " expected vs ", h("b", { text: fmtN(t.tokens_per_round, 2) }), " realised tokens/round")] : []),
      ...(cost ? costPolicyStats(cost) : []));
  }

  // what the cost policy works from: the run of accepted tokens, acceptance by run position, and how
  // often the drafter's prediction was right in the rounds it kept plain
  function costPolicyStats(p) {
    const acc = Object.entries(p.acceptance_by_run_position).flatMap(([k, v], i) =>
      [i ? " · " : "", k + " ", h("b", { text: (100 * v).toFixed(0) + "%" })]);
    return [
      h("span", { class: "sv-policy-run" }, h("b", { text: String(p.run) }), " accepted in a row"),
      h("span", { class: "sv-policy-acc", title: "the cost policy's acceptance estimate after a run of this many accepted tokens" },
        "acceptance by run: ", ...acc),
      ...(p.shadow_tries ? [h("span", { class: "sv-policy-shadow", title: "rounds the cost policy kept plain, where the drafter's unverified prediction was checked against the target" },
        h("b", { text: p.shadow_hits + "/" + p.shadow_tries }), " plain-round predictions right")] : []),
    ];
  }

  function applyEvents(msg) {
    if (msg.epoch !== S.epoch) {
      if (msg.start !== 0) { hello(); return; }
      S.epoch = msg.epoch;
      clearViews();
    }
    if (msg.start > S.n) { hello(); return; } // a gap: ask for what is missing
    const evs = msg.events || [];
    for (let k = S.n - msg.start; k < evs.length; k++) {
      if (k < 0) continue;
      applyEvent(evs[k]);
      S.n += 1;
    }
    root.dataset.events = String(S.n);
    root.dataset.rounds = String(S.rounds.length);
    const nGen = S.tel ? S.tel.n_generated : null;
    countEl.textContent =
      (S.started ? (S.started.prompt_tokens || []).length + " prompt · " : "") + (nGen == null ? 0 : nGen) + " generated";
    queueScroll();
  }

  // ---- hover / click ----------------------------------------------------------------------------
  function tokAt(e) {
    const s = e.target.closest ? e.target.closest(".sv-tok[data-i]") : null;
    if (!s || !stream.contains(s)) return null;
    return [s, S.toks[+s.dataset.i]];
  }
  function describe(t) {
    const kind = { "sv-prompt": "prompt", "sv-acc": "accepted draft", "sv-bonus": "bonus (target)",
      "sv-corr": "correction (target)", "sv-plain": "target (no draft)", "sv-rej": "rejected draft" }[t.cls];
    const rows = [["text", quote(t.piece)], ["id", String(t.id)], ["kind", kind]];
    if (t.cls === "sv-prompt") rows.push(["position", String(t.pos)]);
    else {
      rows.push(["round", String(t.round)], ["depth", String(t.depth)]);
      rows.push(["draft p", fmtP(t.dp)], ["target p", fmtP(t.tp)]);
    }
    if (t.rej && t.first) rows.push(["target chose", quote(t.rej.target_piece) + " (" + fmtP(t.rej.target_prob) + ")"]);
    return rows;
  }
  function table(rows) {
    return h("table", { class: "sv-kvtable" }, ...rows.map(([k, v]) => h("tr", null, h("th", { text: k }), h("td", { text: v }))));
  }
  stream.addEventListener("mouseover", (e) => {
    const hit = tokAt(e);
    if (!hit) { tip.hidden = true; return; }
    const [s, t] = hit;
    tip.replaceChildren(table(describe(t)));
    tip.hidden = false;
    const r = s.getBoundingClientRect();
    tip.style.left = Math.max(4, Math.min(window.innerWidth - 260, r.left)) + "px";
    tip.style.top = (r.bottom + 6) + "px";
  });
  stream.addEventListener("mouseleave", () => { tip.hidden = true; });
  stream.addEventListener("click", (e) => {
    const tg = e.target.closest ? e.target.closest(".sv-rejtgl") : null;
    if (tg) { tg.parentElement.classList.toggle("sv-collapsed"); return; }
    const hit = tokAt(e);
    if (!hit) return;
    const [s, t] = hit;
    for (const o of stream.querySelectorAll(".sv-sel")) o.classList.remove("sv-sel");
    s.classList.add("sv-sel");
    showDetail(t);
  });

  function showDetail(t) {
    const parts = [h("div", { class: "sv-detail-h" }, h("span", { class: "sv-tok " + t.cls, text: showPiece(t.piece) }),
      h("span", { class: "sv-muted", text: t.cls === "sv-prompt" ? " prompt token " + t.pos : " round " + t.round + " · depth " + t.depth }))];
    parts.push(table(describe(t)));
    if (t.rej) {
      const rej = t.rej;
      const alts = rej.alternatives || [];
      const box = h("div", { class: "sv-alts" },
        h("div", { class: "sv-alts-h", text: "Target's top alternatives at round " + rej.round + ", depth " + rej.depth +
          " (draft proposed " + quote(rej.pieces[0]) + ")" }));
      const maxp = Math.max(1e-9, ...alts.map((a) => a.prob || 0));
      for (const a of alts) {
        const chosen = a.token === rej.target_token;
        const drafted = a.token === rej.tokens[0];
        box.append(h("div", { class: "sv-alt" + (chosen ? " sv-alt-chosen" : "") + (drafted ? " sv-alt-drafted" : "") },
          h("span", { class: "sv-alt-piece", text: showPiece(a.piece) }),
          h("span", { class: "sv-alt-bar" }, h("span", { style: "width:" + (100 * (a.prob || 0) / maxp).toFixed(1) + "%" })),
          h("span", { class: "sv-alt-p", text: fmtP(a.prob) }),
          h("span", { class: "sv-alt-id", text: "#" + a.token + (chosen ? " · chosen" : "") + (drafted ? " · drafted" : "") })));
      }
      if (!alts.length) box.append(h("div", { class: "sv-muted", text: "no alternatives recorded" }));
      parts.push(box);
    }
    detail.replaceChildren(...parts);
  }

  showRej.addEventListener("change", () => root.classList.toggle("sv-hide-rej", !showRej.checked));

  // ---- controls ---------------------------------------------------------------------------------
  btnStep.addEventListener("click", () => host.send({ type: "cmd", cmd: "step" }));
  btnRun.addEventListener("click", () => host.send({ type: "cmd", cmd: "run", n: Math.max(1, parseInt(runN.value || "1", 10)) }));
  btnPlay.addEventListener("click", () => host.send({ type: "cmd", cmd: config.running ? "pause" : "play" }));
  btnReset.addEventListener("click", () => host.send({ type: "cmd", cmd: "reset", prompt: promptBox.value,
    max_tokens: parseInt(maxTok.value || "0", 10) || null }));
  stratSel.addEventListener("change", () => {
    stratErr.textContent = "";
    host.send({ type: "schema", strategy: stratSel.value });
  });
  btnApply.addEventListener("click", () => {
    const knobs = {};
    for (const f of form.querySelectorAll(".sv-field[data-knob]")) {
      const inp = f.querySelector("input,select");
      knobs[f.dataset.knob] = inp.type === "checkbox" ? inp.checked : inp.value;
      f.classList.remove("sv-invalid");
      f.querySelector(".sv-field-err").textContent = "";
    }
    stratErr.textContent = "";
    formNote.textContent = "";
    host.send({ type: "configure", strategy: stratSel.value, knobs });
  });

  function buildForm(strategy, schema, values) {
    formStrategy = strategy;
    formSchema = schema || [];
    form.replaceChildren();
    for (const k of formSchema) {
      const v = values && k.name in values ? values[k.name] : k.default;
      let inp;
      if (k.type === "bool") {
        inp = h("input", { type: "checkbox", checked: !!v });
      } else if (k.choices && k.choices.length) {
        inp = h("select", null, ...k.choices.map((c) => h("option", { value: c, selected: c === v, text: c })));
      } else if (k.name === "draft_model" && (config.draft_models || []).length) {
        // a free-text path, with the host's known drafts offered (and the first one prefilled)
        const listId = "sv-drafts-" + uid;
        inp = h("input", { type: "text", list: listId, value: v ? String(v) : config.draft_models[0], title: "path of the draft GGUF" });
        form.append(h("datalist", { id: listId }, ...config.draft_models.map((d) => h("option", { value: d, text: basename(d) }))));
      } else {
        inp = h("input", { type: "text", inputmode: k.type === "str" ? "text" : "decimal", value: v == null ? "" : String(v) });
      }
      inp.classList.add("sv-input");
      const range = k.choices && k.choices.length ? "" : (k.lo != null || k.hi != null) ? "[" + (k.lo ?? "−∞") + ", " + (k.hi ?? "∞") + "]" : "";
      form.append(h("div", { class: "sv-field", "data-knob": k.name, title: k.help || "" },
        h("label", { class: "sv-lbl" }, h("span", { text: k.name }), h("span", { class: "sv-range", text: range })),
        inp, h("div", { class: "sv-field-err" })));
    }
    if (!formSchema.length) form.append(h("div", { class: "sv-muted", text: "this strategy has no knobs" }));
    syncDisabled();
  }

  function syncDisabled() {
    const ro = config.replay || !config.can_control;
    const busy = config.running;
    const done = !!config.finished;
    btnStep.disabled = busy || done || !config.can_step;
    btnRun.disabled = busy || done || !config.can_step;
    btnPlay.disabled = !busy && (done || !config.can_step);
    btnPlay.textContent = busy ? "❚❚ Pause" : "▶ Play";
    btnPlay.classList.toggle("sv-pausing", busy);
    btnReset.disabled = busy || !config.can_reset;
    stratSel.disabled = ro;
    btnApply.disabled = ro;
    for (const i of form.querySelectorAll("input,select")) i.disabled = ro;
    promptBox.disabled = config.replay;
    maxTok.disabled = config.replay;
    sessionFields.hidden = !!config.replay;
  }

  function applyState(st) {
    const prevStrategy = config.strategy;
    const prevKnobs = JSON.stringify(config.knobs);
    config = Object.assign(config, st);
    statusPill.textContent = config.replay ? (config.running ? "replaying" : "replay") : config.running ? "running" : config.finished ? "finished · " + config.finished : config.can_step ? "ready" : "idle";
    statusPill.className = "sv-pill sv-status" + (config.running ? " sv-st-run" : config.finished ? " sv-st-done" : "");
    if (st.strategies) {
      const cur = stratSel.value;
      stratSel.replaceChildren(...st.strategies.map((s) => h("option", { value: s, text: s })));
      stratSel.value = cur && st.strategies.includes(cur) ? cur : config.strategy;
    }
    if (config.strategy && (config.strategy !== prevStrategy || JSON.stringify(config.knobs) !== prevKnobs || formStrategy === null)) {
      stratSel.value = config.strategy;
      buildForm(config.strategy, config.schema, config.knobs);
    }
    if (config.strategy !== prevStrategy || JSON.stringify(config.knobs) !== prevKnobs) { dirty.add("conf"); kickCharts(); }
    if (st.pending) formNote.textContent = "queued: " + st.pending + " — applies at the next round";
    else if ("pending" in st) formNote.textContent = "";
    if (st.prompt != null && !promptBox.value) promptBox.value = st.prompt;
    if (st.error) formNote.textContent = st.error;
    syncDisabled();
  }

  function knobErrors(msg) {
    const errs = msg.errors || {};
    for (const f of form.querySelectorAll(".sv-field[data-knob]")) {
      const m = errs[f.dataset.knob];
      f.classList.toggle("sv-invalid", !!m);
      f.querySelector(".sv-field-err").textContent = m || "";
    }
    if (errs.strategy) stratErr.textContent = errs.strategy;
    formNote.textContent = msg.general || (Object.keys(errs).length ? "nothing changed" : "");
    formNote.classList.toggle("sv-note-err", Object.keys(errs).length > 0 || !!msg.general);
  }

  // ---- charts -----------------------------------------------------------------------------------
  // A plotly redraw is the expensive part of a frame (about 5–15 ms per chart on a small CPU, more
  // with legends, unified hover or autoranged axes — so none of those are used: legends are HTML, the
  // ranges are computed here and the width comes from a ResizeObserver). A round only marks the charts
  // dirty; one dirty chart is redrawn at most every CHART_GAP ms, round-robin, so no frame carries two
  // redraws, most frames carry none, and the charts still trail the stream by well under a second.
  const dirty = new Set();
  let chartRaf = null, nextChart = 0;
  const widths = new Map();
  const ro = typeof ResizeObserver === "function" ? new ResizeObserver((entries) => {
    for (const e of entries) {
      const c = chartList.find((x) => x.box === e.target);
      const w = Math.round(e.contentRect.width);
      if (c && w > 0 && Math.abs((widths.get(c.key) || 0) - w) > 2) { widths.set(c.key, w); dirty.add(c.key); kickCharts(); }
    }
  }) : null;
  if (ro) for (const c of chartList) ro.observe(c.box);

  function scheduleCharts() {
    for (const c of chartList) dirty.add(c.key);
    kickCharts();
  }
  function kickCharts() {
    if (destroyed || !Plotly || chartTimer != null || chartRaf != null || !dirty.size) return;
    const wait = Math.max(0, CHART_GAP - (performance.now() - lastChart));
    chartTimer = setTimeout(() => { chartTimer = null; chartRaf = requestAnimationFrame(drawNextChart); }, wait);
  }
  function drawNextChart() {
    chartRaf = null;
    if (destroyed) return;
    for (let k = 0; k < chartList.length; k++) {
      const c = chartList[(nextChart + k) % chartList.length];
      if (!dirty.has(c.key)) continue;
      dirty.delete(c.key);
      nextChart = (chartList.indexOf(c) + 1) % chartList.length;
      drawChart(c);
      lastChart = performance.now();
      break;
    }
    if (dirty.size) kickCharts();
    else root.dataset.chartRounds = String(S.rounds.length);
  }
  /** Redraw every chart now (staggered=false: tests, benchmark) or mark them all for the scheduler. */
  function drawCharts(staggered = true) {
    if (!Plotly) return;
    if (staggered) { scheduleCharts(); return; }
    for (const c of chartList) drawChart(c);
    dirty.clear();
    lastChart = performance.now();
    root.dataset.chartRounds = String(S.rounds.length);
  }

  let P = null; // palette, read from the CSS variables once (getComputedStyle forces a style pass)
  function pal() {
    if (P) return P;
    const cs = getComputedStyle(root);
    const v = (n) => cs.getPropertyValue(n).trim() || undefined;
    P = { fg2: v("--sv-fg-2"), muted: v("--sv-muted"), grid: v("--sv-grid"), border: v("--sv-border"),
      green: v("--sv-acc-fg"), red: v("--sv-rej-fg"), blue: v("--sv-bonus-fg"), amber: v("--sv-corr-fg"),
      teal: v("--sv-draft-fg"), tealBg: v("--sv-draft-rb"), slate: v("--sv-plain-fg"), accent: v("--sv-accent") };
    return P;
  }
  const plotCfg = { displayModeBar: false, responsive: false, doubleClick: false };
  function layout(c, extra) {
    const p = pal();
    const w = widths.get(c.key);
    return Object.assign({
      height: 210, margin: { l: 46, r: 14, t: 8, b: 36 }, autosize: !w, width: w || undefined,
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 11.5, color: p.fg2 },
      showlegend: false, hovermode: "closest", bargap: 0.18,
      hoverlabel: { font: { size: 12 } },
    }, extra || {});
  }
  function ax(range, extra) {
    const p = pal();
    return Object.assign({ range, autorange: false, fixedrange: true, gridcolor: p.grid, zeroline: false,
      linecolor: p.border, ticks: "", automargin: false }, extra || {});
  }
  const axTitle = (text) => ({ text, font: { size: 11 }, standoff: 6 });
  function roundRange(rs) {
    if (!rs.length) return [0.5, 1.5];
    return [rs[0].round - 0.6, rs[rs.length - 1].round + 0.6];
  }
  // a "nice" axis maximum (1, 2, 2.5, 5 × 10^k) at or above x, so ticks land on round numbers
  const nice = (x) => {
    if (!(x > 0)) return 1;
    const e = Math.pow(10, Math.floor(Math.log10(x)));
    for (const m of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * e >= x) return m * e;
    return 10 * e;
  };
  const maxOf = (xs, d = 1) => { let m = -Infinity; for (const x of xs) if (x != null && x > m) m = x; return m === -Infinity ? d : m; };
  const minOf = (xs, d = 0) => { let m = Infinity; for (const x of xs) if (x != null && x < m) m = x; return m === Infinity ? d : m; };
  const pct = (r) => ax([0, 1.05], { tickvals: [0, 0.25, 0.5, 0.75, 1], ticktext: ["0%", "25%", "50%", "75%", "100%"] });

  function drawChart(c) {
    const spec = chartSpec(c);
    if (!spec) return;
    if (spec.note != null) { c.show(false, spec.note); return; }
    if (!c.shown) c.show(true);
    if (spec.legend) {
      const sig = JSON.stringify(spec.legend);
      if (c.legendSig !== sig) { c.legendSig = sig; c.legend(spec.legend); }
    }
    if (spec.sub != null && c.subEl.textContent !== spec.sub) c.subEl.textContent = spec.sub;
    Plotly.react(c.box, spec.data, spec.layout, plotCfg);
  }

  function chartSpec(c) {
    const R = S.rounds, p = pal();
    const w = R.slice(-CHART_ROUNDS);
    const wx = w.map((r) => r.round);
    switch (c.key) {
      case "kv": {
        const kv = R.slice(-KV_ROUNDS), xs = kv.map((r) => r.round);
        const draft = S.hasDraftKV;
        const data = [
          { type: "bar", x: xs, base: kv.map((r) => r.before), y: kv.map((r) => (r.after ?? r.peak ?? 0) - (r.before ?? 0)),
            offsetgroup: "t", marker: { color: p.green }, customdata: kv.map((r) => [r.before, r.peak, r.after]),
            hovertemplate: "round %{x}<br>target: %{customdata[0]} → peak %{customdata[1]} → %{customdata[2]}<extra></extra>" },
          { type: "bar", x: xs, base: kv.map((r) => r.after), y: kv.map((r) => (r.peak ?? 0) - (r.after ?? r.peak ?? 0)),
            offsetgroup: "t", marker: { color: p.red, opacity: 0.85 }, customdata: kv.map((r) => r.peak),
            hovertemplate: "round %{x}<br>target rollback: removed [%{base}, %{customdata})<extra></extra>" },
        ];
        const legend = [["sv-sw-tc", "target: committed"], ["sv-sw-tr", "target: rolled back"]];
        if (draft) {
          data.push(
            { type: "bar", x: xs, base: kv.map((r) => r.dBefore), y: kv.map((r) => (r.dAfter ?? r.dPeak ?? 0) - (r.dBefore ?? 0)),
              offsetgroup: "d", marker: { color: p.teal }, customdata: kv.map((r) => [r.dBefore, r.dPeak, r.dAfter]),
              hovertemplate: "round %{x}<br>draft ctx: %{customdata[0]} → peak %{customdata[1]} → %{customdata[2]}<extra></extra>" },
            { type: "bar", x: xs, base: kv.map((r) => r.dAfter), y: kv.map((r) => (r.dPeak ?? 0) - (r.dAfter ?? r.dPeak ?? 0)),
              offsetgroup: "d", marker: { color: p.amber, opacity: 0.85 }, customdata: kv.map((r) => r.dPeak),
              hovertemplate: "round %{x}<br>draft rollback: removed [%{base}, %{customdata})<extra></extra>" });
          legend.push(["sv-sw-dc", "draft ctx: committed"], ["sv-sw-dr", "draft ctx: rolled back"]);
        }
        const ys = kv.flatMap((r) => [r.before, r.peak, r.after, r.dBefore, r.dPeak]);
        let lo = minOf(ys, 0), hi = maxOf(ys, 1);
        const nswa = S.started ? S.started.n_swa : 0;
        const shapes = [];
        if (nswa > 0 && kv.length && maxOf(kv.map((r) => r.after), 0) > nswa) {
          data.push({ type: "scatter", mode: "lines", x: xs, y: kv.map((r) => Math.max(0, (r.after ?? 0) - nswa)),
            line: { dash: "dot", color: p.blue, width: 1.5 }, hovertemplate: "oldest attended position %{y} (window " + nswa + ")<extra></extra>" });
          lo = Math.min(lo, Math.max(0, (kv[0].after ?? 0) - nswa));
          legend.push(["sv-sw-swa", "sliding-window start"]);
        }
        const pad = Math.max(2, Math.round((hi - lo) * 0.06));
        return { legend, data, layout: layout(c, { height: 240, barmode: draft ? "group" : "overlay", bargap: 0.3, bargroupgap: 0.08, shapes,
          xaxis: ax(roundRange(kv), { title: axTitle("round") }), yaxis: ax([Math.max(0, lo - pad), hi + pad], { title: axTitle("KV position") }) }) };
      }
      case "acc": {
        return { data: [
          { type: "bar", x: wx, y: w.map((r) => r.rate), marker: { color: p.green, opacity: 0.55 },
            customdata: w.map((r) => [r.nacc, r.drafted]), hovertemplate: "round %{x}: %{customdata[0]}/%{customdata[1]} accepted<extra></extra>" },
          { type: "scatter", mode: "lines", x: wx, y: w.map((r) => r.cum), line: { color: p.blue, width: 2.5, shape: "hv" },
            hovertemplate: "cumulative %{y:.1%}<extra></extra>" },
        ], layout: layout(c, { xaxis: ax(roundRange(w), { title: axTitle("round") }), yaxis: pct() }) };
      }
      case "hist": {
        const hx = [], hy = [];
        for (let i = 1; i < S.hist.length; i++) { hx.push(i); hy.push(S.hist[i] || 0); }
        const n = Math.max(2, S.hist.length);
        return { data: [{ type: "bar", x: hx, y: hy, marker: { color: p.blue },
          hovertemplate: "%{y} rounds committed %{x} token(s)<extra></extra>" }],
        layout: layout(c, { xaxis: ax([0.4, n - 0.4], { dtick: n > 20 ? 2 : 1, title: axTitle("tokens committed in the round") }),
          yaxis: ax([0, nice(Math.max(1, maxOf(hy, 1)) * 1.05)], { title: axTitle("rounds") }) }) };
      }
      case "pos": {
        const pa = S.posAcc || [], tries = S.posTries || [];
        if (!pa.length) return { note: "No draft tokens yet: per-position acceptance appears once the strategy drafts." };
        return { data: [{ type: "bar", x: pa.map((_, i) => i + 1), y: pa, marker: { color: p.green }, customdata: pa.map((_, i) => tries[i] ?? ""),
          hovertemplate: "depth %{x}: %{y:.1%} of %{customdata} drafts<extra></extra>" }],
        layout: layout(c, { yaxis: pct(), xaxis: ax([0.4, pa.length + 0.6], { dtick: pa.length > 20 ? 2 : 1, title: axTitle("draft position") }) }) };
      }
      case "time": {
        const stackMax = maxOf(w.map((r) => (r.draftMs || 0) + (r.verifyMs || 0)), 1);
        const tpsMax = maxOf(w.map((r) => r.tps), 1);
        return { data: [
          { type: "scatter", mode: "lines", stackgroup: "t", x: wx, y: w.map((r) => r.draftMs), line: { color: p.amber, width: 1 },
            hovertemplate: "round %{x}: drafting %{y:.1f} ms<extra></extra>" },
          { type: "scatter", mode: "lines", stackgroup: "t", x: wx, y: w.map((r) => r.verifyMs), line: { color: p.blue, width: 1 },
            hovertemplate: "round %{x}: verification %{y:.1f} ms<extra></extra>" },
          { type: "scatter", mode: "lines", x: wx, y: w.map((r) => r.tps), yaxis: "y2", line: { color: p.green, width: 2.5 },
            hovertemplate: "%{y:.1f} tokens/s so far<extra></extra>" },
        ], layout: layout(c, { margin: { l: 46, r: 46, t: 8, b: 36 }, xaxis: ax(roundRange(w), { title: axTitle("round") }),
          yaxis: ax([0, nice(stackMax * 1.05)], { title: axTitle("ms") }),
          yaxis2: ax([0, nice(tpsMax * 1.05)], { tickmode: "auto", nticks: 5, overlaying: "y", side: "right", showgrid: false, title: axTitle("tok/s") }) }) };
      }
      case "conf": {
        const bs = (S.tel && S.tel.draft_buckets) || [];
        const total = bs.reduce((a, b) => a + (b.tries || 0), 0);
        if (!total) {
          const modelDraft = config.strategy === "draft" || (S.started && S.started.draft_model);
          return { note: modelDraft ? "No draft tokens yet: this chart fills as the draft model proposes tokens."
            : "No drafter probabilities: " + (config.strategy || "this strategy") + " drafts without a probability (n-gram strategies copy " +
              "tokens). Choose the draft strategy to see whether the draft's confidence predicts acceptance — the chart draft_p_min is tuned from." };
        }
        const xs = bs.map((b) => (b.lo + b.hi) / 2);
        const pmin = config.strategy === "draft" && config.knobs ? config.knobs.draft_p_min : null;
        const shapes = pmin != null ? [{ type: "line", x0: pmin, x1: pmin, y0: 0, y1: 1.05, yref: "y", line: { color: p.red, width: 2, dash: "dash" } }] : [];
        return { data: [
          { type: "bar", x: xs, y: bs.map((b) => (b.tries ? b.rate : null)), width: 0.085, marker: { color: p.green },
            customdata: bs.map((b) => [b.lo, b.hi, b.accepted, b.tries]),
            hovertemplate: "draft p in [%{customdata[0]}, %{customdata[1]}): %{customdata[2]}/%{customdata[3]} accepted (%{y:.0%})<extra></extra>" },
          { type: "scatter", mode: "lines+markers", x: xs, y: bs.map((b) => b.tries), yaxis: "y2", line: { color: p.muted, width: 1.5, dash: "dot" },
            marker: { size: 5, color: p.muted }, hovertemplate: "%{y} draft tokens<extra></extra>" },
        ], legend: pmin != null ? [["sv-sw-acc", "acceptance in bucket"], ["sv-sw-tries", "draft tokens"], ["sv-sw-pmin", "draft_p_min = " + pmin]]
          : [["sv-sw-acc", "acceptance in bucket"], ["sv-sw-tries", "draft tokens"]],
        layout: layout(c, { shapes, margin: { l: 46, r: 46, t: 8, b: 36 },
          xaxis: ax([0, 1], { dtick: 0.1, tickformat: ".1f", title: axTitle("draft model's probability of its token") }), yaxis: pct(),
          yaxis2: ax([0, nice(maxOf(bs.map((b) => b.tries), 1) * 1.05)], { tickmode: "auto", nticks: 5, overlaying: "y", side: "right", showgrid: false, title: axTitle("tokens") }) }) };
      }
      case "tpr": {
        const exp = S.hasExpected;
        const data = [
          { type: "bar", x: wx, y: w.map((r) => r.committed), marker: { color: p.blue, opacity: 0.45 },
            hovertemplate: "round %{x}: %{y} committed<extra></extra>" },
          { type: "scatter", mode: "lines", x: wx, y: w.map((r) => r.tpr), line: { color: p.blue, width: 2.5 },
            hovertemplate: "mean %{y:.2f} tokens/round<extra></extra>" },
        ];
        if (exp) data.push(
          { type: "scatter", mode: "markers", x: wx, y: w.map((r) => r.expected), marker: { symbol: "line-ew-open", size: 9, color: p.amber, line: { width: 2, color: p.amber } },
            hovertemplate: "round %{x}: expected %{y:.2f}<extra></extra>" },
          { type: "scatter", mode: "lines", x: wx, y: w.map((r) => r.expMean), line: { color: p.amber, width: 2, dash: "dash" },
            hovertemplate: "mean expected %{y:.2f} tokens/round<extra></extra>" });
        const legend = [["sv-sw-verify", "committed this round"], ["sv-sw-line", "mean tokens/round"]];
        if (exp) legend.push(["sv-sw-tick", "expected this round"], ["sv-sw-exp", "mean expected (cost policy)"]);
        return { data, legend, sub: exp ? "realised vs the cost policy's expectation" : "realised; the expectation shows with draft_policy = cost",
          layout: layout(c, { xaxis: ax(roundRange(w), { title: axTitle("round") }),
            yaxis: ax([0, nice(Math.max(2, maxOf(w.map((r) => Math.max(r.committed || 0, r.expected || 0)), 1)) * 1.05)], { title: axTitle("tokens") }) }) };
      }
      default:
        return null;
    }
  }

  // ---- messages ---------------------------------------------------------------------------------
  function hello() { host.send({ type: "hello", epoch: S.epoch, have: S.n }); }

  function onMsg(msg) {
    if (destroyed || !msg || typeof msg !== "object") return;
    switch (msg.type) {
      case "events": applyEvents(msg); break;
      case "state": applyState(msg); break;
      case "knob_errors": knobErrors(msg); break;
      case "schema":
        if (msg.strategy === stratSel.value) buildForm(msg.strategy, msg.knobs, msg.strategy === config.strategy ? config.knobs : null);
        if (msg.error) stratErr.textContent = msg.error;
        break;
      case "plotly":
        try { installPlotly(msg.source); } catch (e) { console.error("specviz: could not load plotly", e); }
        break;
      case "notice":
        formNote.textContent = msg.text;
        formNote.classList.toggle("sv-note-err", msg.level === "error");
        break;
      default: break;
    }
  }
  host.on(onMsg);
  hello();
  getPlotly(host).then((P) => {
    if (destroyed) return;
    Plotly = P;
    for (const b of root.querySelectorAll(".sv-chart-loading")) b.remove();
    drawCharts();
  });

  // test/benchmark hooks (no effect on the widget itself)
  root.__specviz = { state: S, apply: onMsg, drawCharts, drawChart: (key) => drawChart(chartList.find((c) => c.key === key)), charts: chartList.map((c) => c.key) };

  const cleanup = () => {
    destroyed = true;
    host.off(onMsg);
    if (chartTimer != null) clearTimeout(chartTimer);
    if (chartRaf != null) cancelAnimationFrame(chartRaf);
    if (ro) ro.disconnect();
    root.remove();
    el.__specvizCleanup = null;
  };
  el.__specvizCleanup = cleanup;
  return cleanup;
}

function basename(p) {
  if (!p) return "";
  const s = String(p).split(/[\\/]/);
  return s[s.length - 1];
}
function knobText(knobs) {
  return Object.entries(knobs || {}).map(([k, v]) => k + "=" + v).join(", ");
}

export { render };
export default { render };
