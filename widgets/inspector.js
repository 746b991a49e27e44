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

const CHART_ROUNDS = 120; // per-round charts show the most recent rounds
const KV_ROUNDS = 30;
const CHART_MIN_INTERVAL = 250; // ms between two chart redraws while rounds stream in

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
    ["tps", "tokens/s"], ["acceptance", "acceptance"], ["mal", "mean accepted len"],
    ["generated", "generated"], ["rounds", "rounds"], ["kv", "KV committed"],
  ];
  const statEls = {};
  const stats = h("div", { class: "sv-stats" }, ...statDefs.map(([k, label]) => {
    const v = h("div", { class: "sv-stat-v", text: "—" });
    statEls[k] = v;
    return h("div", { class: "sv-stat", "data-k": k }, v, h("div", { class: "sv-stat-l", text: label }));
  }));

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

  // charts
  const mkChart = (cls, label, sub) => {
    const box = h("div", { class: "sv-chart " + cls }, h("div", { class: "sv-chart-loading", text: "loading charts…" }));
    const card = h("div", { class: "sv-card sv-chart-card" },
      h("div", { class: "sv-card-h" }, h("span", { text: label }), h("span", { class: "sv-sub", text: sub || "" })), box);
    return { box, card };
  };
  const kvSwa = h("span", { class: "sv-sub sv-swa", text: "" });
  const cKV = mkChart("sv-kv", "KV cache timeline", "before → peak → after rollback, last " + KV_ROUNDS + " rounds");
  cKV.card.querySelector(".sv-card-h").append(kvSwa);
  const cAcc = mkChart("sv-acc-chart", "Acceptance rate", "per round (last " + CHART_ROUNDS + ") and cumulative");
  const cHist = mkChart("sv-hist", "Accepted length", "tokens committed per round");
  const cPos = mkChart("sv-pos", "Per-position acceptance", "by draft depth");
  const cTime = mkChart("sv-time", "Drafting vs verification", "ms per round, tokens/s");
  const charts = h("div", { class: "sv-charts" }, cKV.card, cAcc.card, cHist.card, cPos.card, cTime.card);

  const tip = h("div", { class: "sv-tip", hidden: true });
  root.append(header, toolbar, top, charts, tip);
  el.append(root);
  if (document.body && document.body.dataset && document.body.dataset.jpThemeLight === "false") root.classList.add("sv-dark");

  // ---- state ----------------------------------------------------------------------------------
  function newState() {
    return {
      epoch: -1, n: 0, started: null, toks: [], rounds: [], cur: null, tel: null, finished: null,
      hist: [], posAcc: [], rejGroups: 0,
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
      tps: c.tel ? c.tel.tokens_per_second : null,
      before, peak, after, rbT: c.rb.target || null, rbD: c.rb.draft || null,
    };
    S.rounds.push(r);
    maybeCloseChunk(c.lastPiece);
    S.hist[committed] = (S.hist[committed] || 0) + 1;
    if (c.tel && c.tel.per_position_acceptance) S.posAcc = c.tel.per_position_acceptance;
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
  function scheduleCharts() {
    if (chartTimer != null || destroyed) return;
    const wait = Math.max(0, CHART_MIN_INTERVAL - (performance.now() - lastChart));
    chartTimer = setTimeout(() => {
      chartTimer = null;
      requestAnimationFrame(() => { if (!destroyed) drawCharts(); });
    }, wait);
  }

  const css = (v) => getComputedStyle(root).getPropertyValue(v).trim() || undefined;
  function baseLayout(extra) {
    const fg = css("--sv-fg-2"), grid = css("--sv-grid");
    return Object.assign({
      margin: { l: 40, r: 12, t: 8, b: 30 }, height: 210, autosize: true,
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 11, color: fg },
      xaxis: { gridcolor: grid, zeroline: false }, yaxis: { gridcolor: grid, zeroline: false },
      showlegend: true, legend: { orientation: "h", y: 1.12, x: 0, font: { size: 10 } },
      bargap: 0.15, hovermode: "x unified",
    }, extra || {});
  }
  const plotCfg = { displayModeBar: false, responsive: true };

  // While rounds stream in, the five charts are redrawn one per animation frame so that no single
  // frame carries all of them.
  function drawCharts(staggered = true) {
    lastChart = performance.now();
    if (!Plotly) return;
    const jobs = chartJobs();
    if (!staggered) { for (const j of jobs) j(); return; }
    const next = () => {
      if (destroyed || !jobs.length) return;
      jobs.shift()();
      if (jobs.length) requestAnimationFrame(next);
    };
    next();
  }

  function chartJobs() {
    const jobs = [];
    const R = S.rounds;
    const green = css("--sv-acc-fg"), red = css("--sv-rej-fg"), blue = css("--sv-bonus-fg"), amber = css("--sv-corr-fg"), gray = css("--sv-fg-2");
    // KV timeline
    const kv = R.slice(-KV_ROUNDS);
    const xs = kv.map((r) => r.round);
    const kvData = [
      { type: "bar", name: "committed", x: xs, base: kv.map((r) => r.before), y: kv.map((r) => (r.after ?? r.peak ?? 0) - (r.before ?? 0)),
        marker: { color: green }, offsetgroup: "t", hovertemplate: "round %{x}: %{base} → %{customdata}<extra>committed</extra>",
        customdata: kv.map((r) => r.after) },
      { type: "bar", name: "rolled back (target)", x: xs, base: kv.map((r) => r.after), y: kv.map((r) => (r.peak ?? 0) - (r.after ?? r.peak ?? 0)),
        marker: { color: red, opacity: 0.8 }, offsetgroup: "t",
        hovertemplate: "round %{x}: removed [%{base}, %{customdata})<extra>target rollback</extra>", customdata: kv.map((r) => r.peak) },
      { type: "scatter", mode: "markers", name: "peak", x: xs, y: kv.map((r) => r.peak), marker: { symbol: "line-ew-open", size: 14, color: gray },
        hovertemplate: "peak %{y}<extra></extra>" },
    ];
    if (R.some((r) => r.rbD)) {
      kvData.push({ type: "bar", name: "rolled back (draft ctx)", x: xs, base: kv.map((r) => (r.rbD ? r.rbD.to_pos : null)),
        y: kv.map((r) => (r.rbD ? r.rbD.from_pos - r.rbD.to_pos : 0)), offsetgroup: "d",
        marker: { color: amber, opacity: 0.7 }, hovertemplate: "draft ctx: removed [%{base}, …)<extra></extra>" });
    }
    const ys = kv.flatMap((r) => [r.before, r.peak, r.after]).filter((v) => v != null);
    const shapes = [];
    const nswa = S.started ? S.started.n_swa : 0;
    if (nswa > 0 && kv.length) {
      kvData.push({ type: "scatter", mode: "lines", name: "SWA window start", x: xs, y: kv.map((r) => Math.max(0, (r.after ?? 0) - nswa)),
        line: { dash: "dot", color: blue, width: 1.5 }, hovertemplate: "oldest attended position %{y} (window " + nswa + ")<extra></extra>" });
    }
    const lo = ys.length ? Math.min(...ys) : 0, hi = ys.length ? Math.max(...ys) : 1;
    const ylo = nswa > 0 && kv.length && Math.max(0, (kv[0].after ?? 0) - nswa) > 0 ? Math.min(lo, Math.max(0, kv[0].after - nswa)) : lo;
    jobs.push(() => Plotly.react(cKV.box, kvData, baseLayout({ barmode: "overlay", shapes, height: 250,
      yaxis: { gridcolor: css("--sv-grid"), title: { text: "position", font: { size: 10 } }, range: [Math.max(0, ylo - 2), hi + 2] },
      xaxis: { gridcolor: css("--sv-grid"), title: { text: "round", font: { size: 10 } } } }), plotCfg));

    // acceptance
    const w = R.slice(-CHART_ROUNDS);
    jobs.push(() => Plotly.react(cAcc.box, [
      { type: "bar", name: "this round", x: w.map((r) => r.round), y: w.map((r) => r.rate), marker: { color: green, opacity: 0.55 },
        hovertemplate: "%{y:.0%}<extra>round</extra>" },
      { type: "scatter", mode: "lines", name: "cumulative", x: w.map((r) => r.round), y: w.map((r) => r.cum), line: { color: blue, width: 2.5, shape: "hv" },
        hovertemplate: "%{y:.1%}<extra>cumulative</extra>" },
    ], baseLayout({ yaxis: { range: [0, 1.05], tickformat: ".0%", gridcolor: css("--sv-grid") } }), plotCfg));

    // accepted-length histogram
    const hx = [], hy = [];
    for (let i = 0; i < S.hist.length; i++) { hx.push(i); hy.push(S.hist[i] || 0); }
    jobs.push(() => Plotly.react(cHist.box, [{ type: "bar", name: "rounds", x: hx, y: hy, marker: { color: blue },
      hovertemplate: "%{y} rounds committed %{x} tokens<extra></extra>" }],
    baseLayout({ showlegend: false, hovermode: "closest", xaxis: { dtick: 1, gridcolor: css("--sv-grid"), title: { text: "tokens committed in the round", font: { size: 10 } } } }), plotCfg));

    // per-position acceptance
    const pa = S.posAcc || [];
    jobs.push(() => Plotly.react(cPos.box, [{ type: "bar", name: "acceptance", x: pa.map((_, i) => i + 1), y: pa, marker: { color: green },
      hovertemplate: "depth %{x}: %{y:.1%}<extra></extra>" }],
    baseLayout({ showlegend: false, hovermode: "closest", yaxis: { range: [0, 1.05], tickformat: ".0%", gridcolor: css("--sv-grid") },
      xaxis: { dtick: 1, gridcolor: css("--sv-grid"), title: { text: "draft position", font: { size: 10 } } } }), plotCfg));

    // timing
    jobs.push(() => Plotly.react(cTime.box, [
      { type: "scatter", mode: "lines", stackgroup: "t", name: "drafting ms", x: w.map((r) => r.round), y: w.map((r) => r.draftMs), line: { color: amber, width: 1 } },
      { type: "scatter", mode: "lines", stackgroup: "t", name: "verification ms", x: w.map((r) => r.round), y: w.map((r) => r.verifyMs), line: { color: blue, width: 1 } },
      { type: "scatter", mode: "lines", name: "tokens/s", x: w.map((r) => r.round), y: w.map((r) => r.tps), yaxis: "y2", line: { color: green, width: 2.5 } },
    ], baseLayout({ yaxis: { gridcolor: css("--sv-grid"), title: { text: "ms", font: { size: 10 } } },
      yaxis2: { overlaying: "y", side: "right", showgrid: false, title: { text: "tok/s", font: { size: 10 } } },
      margin: { l: 40, r: 40, t: 8, b: 30 } }), plotCfg));
    const nR = R.length;
    jobs.push(() => { root.dataset.chartRounds = String(nR); });
    return jobs;
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
  root.__specviz = { state: S, apply: onMsg, drawCharts };

  const cleanup = () => {
    destroyed = true;
    host.off(onMsg);
    if (chartTimer != null) clearTimeout(chartTimer);
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
