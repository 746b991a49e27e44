// The token stream card: every token coloured by its status (a token the grammar forced also underlined
// with dots, token_class.js), one span per round, the rejected draft
// tokens of a round in a collapsible group, knob-change markers, and the "finished" bar. A block draft
// (DFlash, DSpark) is one boxed span led by a strip with the fate of each of its positions (drafted in
// parallel, not a chain); where a chain of drafters changes member, a marker names the one that drafted.
//
// Rendering is incremental: each event appends only the tokens it added to the state. The stream is
// split into block chunks so that appending a round re-lays out only the last chunk (one huge inline
// paragraph costs a full reflow per append); off-screen chunks skip rendering (CSS content-visibility).

import { blockPositions, blockTitle, drafterChanged } from "../block.js";
import { h } from "../dom.js";
import { knobText, showPiece } from "../format.js";
import { seqAt, seqSlice } from "../seq.js";
import { tokenClass } from "./token_class.js";

/** Tokens after which a chunk is closed at the next newline, and after which it is closed anyway. */
const CHUNK_TOKENS = 300, CHUNK_MAX = 1200;

/**
 * `{card, el, clear(), event(ev, state, prev), batchDone(state)}`. `detail` is the detail view (hover,
 * click); `getState()` the current state, read when the pointer moves over a token.
 */
export function streamView(detail, getState) {
  const el = h("div", { class: "sv-stream", tabindex: "0" });
  const finishedBar = h("div", { class: "sv-finished", hidden: true });
  const countEl = h("span", { class: "sv-sub sv-count", text: "" });
  const card = h("div", { class: "sv-card sv-stream-card" },
    h("div", { class: "sv-card-h" }, h("span", { text: "Token stream" }), countEl),
    el, finishedBar, detail.panel);

  let chunk = null, chunkTokens = 0;
  let wrap = null; // the span of the round being received: {round, el}
  let lastPiece = null; // the newest committed token's text (a chunk closes after a newline)

  // Follow the newest tokens unless the user scrolled up; decided on scroll, applied once per frame,
  // so an append never forces a synchronous layout of the whole stream.
  let follow = true, scrollQueued = false;
  el.addEventListener("scroll", () => {
    if (!scrollQueued) follow = el.scrollHeight - el.scrollTop - el.clientHeight < 24;
  });
  function queueScroll() {
    if (!follow || scrollQueued) return;
    scrollQueued = true;
    requestAnimationFrame(() => {
      el.scrollTop = el.scrollHeight;
      scrollQueued = false;
    });
  }

  function sink() {
    if (!chunk) {
      chunk = h("div", { class: "sv-chunk" });
      el.append(chunk);
      chunkTokens = 0;
    }
    return chunk;
  }
  function maybeCloseChunk(piece) {
    if (chunkTokens >= CHUNK_MAX || (chunkTokens >= CHUNK_TOKENS && piece && piece.endsWith("\n"))) chunk = null;
  }

  // The nodes of token `t` (index `i` in the state): its span, then a line break per newline it holds
  // (rejected tokens stay inline).
  function tokenNodes(t, i, into) {
    chunkTokens += 1;
    const s = document.createElement("span");
    s.className = "sv-tok " + tokenClass(t);
    if (t.forced) s.dataset.forced = "1";
    s.dataset.i = i;
    s.textContent = showPiece(t.piece);
    into.append(s);
    if (t.piece && t.status !== "rejected") {
      const breaks = (String(t.piece).match(/\n/g) || []).length;
      for (let k = 0; k < breaks; k++) into.append(document.createElement("br"));
    }
  }
  // Append the tokens [from, to) of the state to `into`.
  function appendTokens(state, from, into) {
    const toks = seqSlice(state.tokens, from);
    toks.forEach((t, k) => tokenNodes(t, from + k, into));
    return toks;
  }

  // A round's span as a block (the strip of its positions' fates and the block's facts in the title), and the
  // drafter's marker before it when the drafting member changed. `info`: {drafter, block, drafted, accepted}.
  function decorateRound(roundEl, info, previous, strategy) {
    if (drafterChanged(info.drafter, previous, strategy)) {
      roundEl.before(h("span", { class: "sv-drafter", title: "drafted by " + info.drafter + " (the first drafter of the chain that drafted)",
        text: "⇢ " + info.drafter }));
    }
    if (info.drafter) roundEl.dataset.drafter = info.drafter;
    if (info.tree) { // a draft tree: the stream shows its kept branch; the Draft tree card shows the tree
      roundEl.classList.add("sv-treeround");
      roundEl.dataset.tree = String(info.tree.width ?? (info.tree.branches || []).length);
      roundEl.title = "a draft tree of " + roundEl.dataset.tree + " branches (its kept branch here): click a token to see the tree";
    }
    const b = info.block;
    if (!b || !info.drafted) return;
    roundEl.classList.add("sv-blk");
    roundEl.title = blockTitle(b, info.drafted, info.accepted);
    const strip = h("span", { class: "sv-blkstrip" });
    for (const c of blockPositions(b.positions || 0, info.drafted, info.accepted)) strip.append(h("i", { class: "sv-bp sv-bp-" + c }));
    roundEl.prepend(strip);
  }

  function clear() {
    el.replaceChildren();
    chunk = null;
    wrap = null;
    lastPiece = null;
    follow = true;
    finishedBar.hidden = true;
    detail.clear();
  }

  // The whole stream again from the state (after a rewind): prompt tokens, then one span per round with
  // its rejected tokens grouped, and a marker where the session went back.
  function rebuild(state, ev) {
    clear();
    const toks = seqSlice(state.tokens);
    const summaries = new Map(seqSlice(state.rounds).map((r) => [r.round, r]));
    let roundEl = null, roundNo = null, rejEl = null, previous = null;
    toks.forEach((t, i) => {
      if (t.status === "prompt") {
        tokenNodes(t, i, sink());
        return;
      }
      if (roundNo !== t.round) {
        roundEl = document.createElement("span");
        roundEl.className = "sv-r";
        roundEl.dataset.round = t.round;
        sink().append(roundEl);
        roundNo = t.round;
        rejEl = null;
        const r = summaries.get(t.round);
        if (r) {
          decorateRound(roundEl, { drafter: r.drafter, block: r.block, drafted: r.drafted, accepted: r.accepted, tree: r.tree },
            previous, state.strategy);
          if (r.drafter) previous = r.drafter;
        }
      }
      if (t.status === "rejected") {
        if (!rejEl) {
          const tgl = h("span", { class: "sv-rejtgl", title: "collapse/expand the rejected draft tokens", text: "✕" });
          rejEl = h("span", { class: "sv-rejin" });
          rejEl.tgl = tgl;
          rejEl.n = 0;
          roundEl.append(h("span", { class: "sv-rejg" }, tgl, rejEl));
        }
        tokenNodes(t, i, rejEl);
        rejEl.n += 1;
        rejEl.tgl.textContent = "✕" + rejEl.n;
      } else {
        tokenNodes(t, i, roundEl);
      }
    });
    if (roundEl) wrap = { round: roundNo, el: roundEl };
    sink().append(h("span", { class: "sv-rewindmark", title: "rewound from round " + ev.from_round + " (" + ev.from_position +
      " tokens) to round " + ev.round + " (" + ev.position + " tokens)", text: "⟲ " + ev.round }));
    if (state.finished) {
      finishedBar.hidden = false;
      finishedBar.textContent = "finished: " + state.finished.reason;
    }
  }

  function event(ev, state, prev) {
    switch (ev.kind) {
      case "rewound":
        rebuild(state, ev);
        break;
      case "session_started": {
        clear();
        const frag = document.createDocumentFragment();
        const toks = appendTokens(state, 0, frag);
        sink().append(frag);
        maybeCloseChunk(toks.length ? toks[toks.length - 1].piece : null);
        break;
      }
      case "knobs_changed":
        sink().append(h("span", { class: "sv-knobmark", title: knobText(ev.knobs), text: "⚙ " + ev.strategy }));
        break;
      case "accepted": {
        const w = document.createElement("span");
        w.className = "sv-r";
        w.dataset.round = ev.round;
        const toks = appendTokens(state, prev.tokens.length, w);
        sink().append(w);
        const d = state.cur && state.cur.round === ev.round ? state.cur.draft : null;
        const drafted = d ? (d.tokens || []).length : 0;
        if (d && drafted) {
          decorateRound(w, { drafter: d.drafter || state.strategy, block: d.block, drafted, accepted: ev.n_accepted, tree: d.tree },
            prev.lastDrafter, state.strategy);
        }
        wrap = { round: ev.round, el: w };
        if (toks.length) lastPiece = toks[toks.length - 1].piece;
        break;
      }
      case "rejected": {
        const n = state.tokens.length - prev.tokens.length;
        const g = h("span", { class: "sv-rejg" }, h("span", { class: "sv-rejtgl", title: "collapse/expand the rejected draft tokens", text: "✕" + n }));
        const inner = h("span", { class: "sv-rejin" });
        appendTokens(state, prev.tokens.length, inner);
        g.append(inner);
        (wrap && wrap.round === ev.round ? wrap.el : sink()).append(g);
        break;
      }
      case "finished":
        finishedBar.hidden = false;
        finishedBar.textContent = "finished: " + ev.reason + " · " + ev.n_generated + " tokens" + (ev.message ? " · " + ev.message : "");
        break;
      default:
        break;
    }
    if (state.rounds.length > prev.rounds.length) { // a round completed: a chunk may end here
      maybeCloseChunk(lastPiece);
      lastPiece = null;
    }
  }

  /** After a message's events: the token count in the card header, and follow the newest tokens. */
  function batchDone(state) {
    const nGen = state.tel ? state.tel.n_generated : null;
    countEl.textContent = (state.started ? (state.started.prompt_tokens || []).length + " prompt · " : "") + (nGen == null ? 0 : nGen) + " generated";
    queueScroll();
  }

  // hover and click: the token under the pointer, looked up in the current state by its index
  function tokenAt(e) {
    const s = e.target.closest ? e.target.closest(".sv-tok[data-i]") : null;
    if (!s || !el.contains(s)) return null;
    const t = seqAt(getState().tokens, +s.dataset.i);
    return t ? [s, t] : null;
  }
  el.addEventListener("mouseover", (e) => {
    const hit = tokenAt(e);
    if (hit) detail.hover(hit[1], hit[0]);
    else detail.hideTip();
  });
  el.addEventListener("mouseleave", () => detail.hideTip());
  el.addEventListener("click", (e) => {
    const tg = e.target.closest ? e.target.closest(".sv-rejtgl") : null;
    if (tg) {
      tg.parentElement.classList.toggle("sv-collapsed");
      return;
    }
    const hit = tokenAt(e);
    if (!hit) return;
    for (const o of el.querySelectorAll(".sv-sel")) o.classList.remove("sv-sel");
    hit[0].classList.add("sv-sel");
    detail.select(hit[1]);
  });

  return { card, el, clear, event, batchDone };
}
