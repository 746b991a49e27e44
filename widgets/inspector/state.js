// The inspector's state and its reducer: reduce(state, event) → state, with no DOM and no plotly.
//
// The state holds everything the views and the charts show for one generation (an epoch of the
// protocol): every token of the stream with its status, one summary per completed round (the KV
// timeline entries among them), the latest telemetry, and `n`, the number of events applied, which the
// hello/gap protocol compares with the `start` of each events message. A reducer never modifies the
// state it is given; growing lists are append-only sequences (seq.js) shared between states.

import { EMPTY_SEQ, seqPush } from "./seq.js";

/** Token statuses, in the order of the legend. */
export const TOKEN_STATUSES = ["prompt", "accepted", "bonus", "correction", "plain", "rejected"];

/** The state of a view that holds no event of `epoch` (-1: no epoch yet). */
export function initialState(epoch = -1) {
  return {
    epoch, // generation whose events the state holds
    n: 0, // events of that epoch applied (every event counts, known kind or not)
    started: null, // the session_started event
    strategy: "", // strategy and knobs as of the last session_started / knobs_changed
    knobs: {},
    knobChanges: 0, // knobs_changed events seen
    tokens: EMPTY_SEQ, // every token of the stream in order: the prompt, then each round's
    rounds: EMPTY_SEQ, // one summary per completed round (see finishRound)
    cur: null, // the round being received: its events so far
    tel: null, // telemetry data after the last completed round
    finished: null, // the finished event
    hist: [], // hist[k]: rounds that committed k tokens
    posAcc: [], // per draft position: share accepted, and drafts that reached it (from telemetry)
    posTries: [],
    hasDraftKV: false, // some round reported the draft model's context
    hasExpected: false, // some round carried the cost policy's expected tokens
    expSum: 0,
    expN: 0,
  };
}

/** The state after `ev`; `state` is not modified. Unknown kinds only advance the event count. */
export function reduce(state, ev) {
  const s = { ...state, n: state.n + 1 };
  if (!ev || typeof ev !== "object") return s;
  switch (ev.kind) {
    case "session_started": {
      const toks = ev.prompt_tokens || [], pieces = ev.prompt_pieces || [];
      const prompt = toks.map((id, i) => ({ status: "prompt", id, piece: pieces[i], round: 0, pos: i }));
      return { ...initialState(state.epoch), n: s.n, started: ev, strategy: ev.strategy || "", knobs: ev.knobs || {},
        tokens: seqPush(EMPTY_SEQ, prompt) };
    }
    case "knobs_changed":
      return { ...s, strategy: ev.strategy || "", knobs: ev.knobs || {}, knobChanges: s.knobChanges + 1 };
    case "draft_proposed":
      return { ...s, cur: { ...newRound(ev.round), draft: ev } };
    case "verified":
      return { ...s, cur: { ...roundOf(s.cur, ev), verified: ev } };
    case "accepted":
      return { ...s, cur: { ...roundOf(s.cur, ev), accepted: ev }, tokens: seqPush(s.tokens, acceptedTokens(ev)) };
    case "rejected":
      return { ...s, cur: { ...roundOf(s.cur, ev), rejected: ev }, tokens: seqPush(s.tokens, rejectedTokens(ev)) };
    case "kv_rollback": {
      const c = roundOf(s.cur, ev);
      const ctx = ev.context === "draft" ? "draft" : "target";
      return { ...s, cur: { ...c, rollbacks: { ...c.rollbacks, [ctx]: ev } } };
    }
    case "telemetry": {
      const tel = ev.data || {};
      return { ...finishRound(s, { ...roundOf(s.cur, ev), tel }), tel };
    }
    case "finished": {
      const done = s.cur && s.cur.accepted ? finishRound(s, s.cur) : s;
      return { ...done, finished: ev };
    }
    default:
      return s;
  }
}

/** `reduce` over a list of events. */
export function reduceAll(state, events) {
  let s = state;
  for (const ev of events) s = reduce(s, ev);
  return s;
}

function newRound(round) {
  return { round, draft: null, verified: null, accepted: null, rejected: null, rollbacks: { target: null, draft: null }, tel: null };
}

// The round an event belongs to: the current one, or a new one when the event starts another round.
function roundOf(cur, ev) {
  return cur && cur.round === ev.round ? cur : newRound(ev.round);
}

/** Target token statuses by the accepted event's bonus_kind. */
function bonusStatus(kind) {
  return kind === "correction" ? "correction" : kind === "bonus" ? "bonus" : "plain";
}

function acceptedTokens(ev) {
  const pieces = ev.pieces || [], toks = ev.tokens || [], dp = ev.draft_probs || [], tp = ev.target_probs || [];
  const out = [];
  for (let j = 0; j < ev.n_accepted; j++) {
    out.push({ status: "accepted", id: toks[j], piece: pieces[j], round: ev.round, depth: j, draftP: dp[j], targetP: tp[j],
      pos: ev.position + j });
  }
  if (ev.bonus_token != null) {
    out.push({ status: bonusStatus(ev.bonus_kind), id: ev.bonus_token, piece: ev.bonus_piece, round: ev.round,
      depth: ev.n_accepted, targetP: ev.bonus_prob, pos: ev.position + ev.n_accepted });
  }
  return out;
}

// Every rejected token keeps the rejection (its alternatives are shown for any of them); the first one
// is the token the target refused, so it carries the target's probability of it.
function rejectedTokens(ev) {
  const toks = ev.tokens || [], pieces = ev.pieces || [], dp = ev.draft_probs || [];
  return toks.map((id, j) => ({ status: "rejected", id, piece: pieces[j], round: ev.round, depth: ev.depth + j,
    draftP: dp[j], targetP: j === 0 ? ev.draft_token_target_prob : null, rejection: ev, first: j === 0 }));
}

/**
 * The state with round `c` summarised and appended to `rounds`; `cur` is cleared. A summary holds what
 * the charts draw: draft/accept counts, timings, the cumulative figures of the round's telemetry and the
 * KV timeline entry of each context (length before the verify batch, peak after it, after the rollback).
 */
function finishRound(s, c) {
  const d = c.draft, v = c.verified, a = c.accepted, tel = c.tel, rb = c.rollbacks;
  const drafted = d ? (d.tokens || []).length : 0;
  const accepted = a ? a.n_accepted : 0;
  const committed = a ? (a.tokens || []).length : 0;
  const peak = v ? v.kv_peak : null;
  const dPeak = v && v.draft_kv_peak != null ? v.draft_kv_peak : null;
  const expected = d && d.expected_tokens != null ? d.expected_tokens : null;
  const expSum = s.expSum + (expected != null ? expected : 0);
  const expN = s.expN + (expected != null ? 1 : 0);
  const r = {
    round: c.round, drafted, accepted, committed,
    rate: drafted > 0 ? accepted / drafted : null,
    cumRate: tel ? tel.acceptance_rate : null,
    draftMs: d ? d.seconds * 1000 : 0,
    verifyMs: v ? v.seconds * 1000 : 0,
    tps: tel ? tel.tokens_per_second : null,
    tpr: tel ? tel.tokens_per_round : null,
    kv: { before: v ? v.kv_before : null, peak,
      after: rb.target ? rb.target.to_pos : tel && tel.kv != null ? tel.kv : peak },
    draftKv: { before: v && v.draft_kv_before != null ? v.draft_kv_before : null, peak: dPeak,
      after: rb.draft ? rb.draft.to_pos : dPeak },
    rollbacks: { target: rb.target, draft: rb.draft },
    expected,
    expectedMean: expN ? expSum / expN : null,
    policy: d ? d.policy : null,
  };
  const hist = s.hist.slice();
  hist[committed] = (hist[committed] || 0) + 1;
  const pos = tel && tel.per_position_acceptance;
  return {
    ...s, cur: null, rounds: seqPush(s.rounds, [r]), hist,
    posAcc: pos ? pos : s.posAcc, posTries: pos ? tel.per_position_tries || [] : s.posTries,
    hasDraftKV: s.hasDraftKV || r.draftKv.before != null,
    hasExpected: s.hasExpected || expected != null, expSum, expN,
  };
}
