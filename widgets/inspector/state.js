// The inspector's state and its reducer: reduce(state, event) → state, with no DOM and no plotly.
//
// The state holds everything the views and the charts show for one generation (an epoch of the
// protocol): every token of the stream with its status, one summary per completed round (the KV
// timeline entries among them), the latest telemetry, and `n`, the number of events applied, which the
// hello/gap protocol compares with the `start` of each events message. A reducer never modifies the
// state it is given; growing lists are append-only sequences (seq.js) shared between states.

import { blockPositions } from "./block.js";
import { EMPTY_SEQ, seqAt, seqPush, seqSlice } from "./seq.js";
import { treeRound } from "./tree_specs.js";

/** Token statuses, in the order of the legend ("kept": committed by a round a rewind cut inside). */
export const TOKEN_STATUSES = ["prompt", "accepted", "bonus", "correction", "plain", "rejected", "kept"];

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
    trees: EMPTY_SEQ, // the summaries of the rounds that verified a draft tree (their `tree`: tree_specs.js treeRound)
    cur: null, // the round being received: its events so far
    tel: null, // telemetry data after the last completed round
    finished: null, // the finished event
    hist: [], // hist[k]: rounds that committed k tokens
    posAcc: [], // per draft position: share accepted, and drafts that reached it (from telemetry)
    posTries: [],
    hasDraftKV: false, // some round reported the draft model's context
    memory: null, // the memory figures of the last telemetry (see memorySummary), null before any
    hasExpected: false, // some round carried the cost policy's expected tokens
    expSum: 0,
    expN: 0,
    rewinds: 0, // rewound events seen
    rewound: null, // the last rewound event
    lastDrafter: null, // the drafter of the last round that drafted (a chain names its members)
    byDrafter: {}, // acceptance per drafter (from telemetry)
    batch: null, // a batched run's steps (batch_step events; see batchStep), null for one request at a time
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
      // a batched run's steps belong to the run, not to the request whose start this is
      return { ...initialState(state.epoch), n: s.n, started: ev, strategy: ev.strategy || "", knobs: ev.knobs || {},
        tokens: seqPush(EMPTY_SEQ, prompt), batch: state.batch };
    }
    case "knobs_changed":
      return { ...s, strategy: ev.strategy || "", knobs: ev.knobs || {}, knobChanges: s.knobChanges + 1 };
    case "draft_proposed":
      return { ...s, cur: { ...newRound(ev.round), draft: ev, pending: ev.tree ? pendingToken(s.tokens) : null } };
    case "verified":
      return { ...s, cur: { ...roundOf(s.cur, ev), verified: ev } };
    case "accepted": {
      const c = roundOf(s.cur, ev);
      return { ...s, cur: { ...c, accepted: ev }, tokens: seqPush(s.tokens, acceptedTokens(ev, c.draft)) };
    }
    case "rejected": {
      const c = roundOf(s.cur, ev);
      return { ...s, cur: { ...c, rejected: ev }, tokens: seqPush(s.tokens, rejectedTokens(ev, c.draft)) };
    }
    case "kv_rollback": {
      const c = roundOf(s.cur, ev);
      const ctx = ev.context === "draft" ? "draft" : "target";
      return { ...s, cur: { ...c, rollbacks: { ...c.rollbacks, [ctx]: ev } } };
    }
    case "memory_checkpoint": {
      const c = roundOf(s.cur, ev);
      const ctx = ev.context === "draft" ? "draft" : "target";
      return { ...s, cur: { ...c, checkpoints: { ...c.checkpoints, [ctx]: ev } } };
    }
    case "telemetry": {
      const tel = ev.data || {};
      const memory = memorySummary(tel) || s.memory;
      return { ...finishRound(s, { ...roundOf(s.cur, ev), tel }), tel, memory };
    }
    case "finished": {
      const done = s.cur && s.cur.accepted ? finishRound(s, s.cur) : s;
      return { ...done, finished: ev };
    }
    case "rewound":
      return rewind(s, ev);
    case "batch_step":
      return { ...s, batch: batchStep(s.batch, ev) };
    default:
      return s;
  }
}

/**
 * The state after a rewind to round `ev.round` (history `ev.position` long): the tokens and round summaries
 * of later rounds are dropped, the tokens a cut round keeps come back as "kept", and the telemetry, the
 * strategy and the finish are the event's. The same whether the dropped events were applied before (a live
 * view) or never seen (a view built from the session's own list, which no longer holds them).
 */
function rewind(s, ev) {
  const N = ev.round;
  const toks = seqSlice(s.tokens).filter((t) => t.status === "prompt" || t.round <= N);
  const keptIds = ev.kept_tokens || [], keptPieces = ev.kept_pieces || [];
  const start = (ev.position || 0) - keptIds.length;
  keptIds.forEach((id, j) => toks.push({ status: "kept", id, piece: keptPieces[j], round: N + 1, depth: j, pos: start + j }));
  const rs = seqSlice(s.rounds).filter((r) => r.round <= N);
  const hist = [];
  let expSum = 0, expN = 0, hasDraftKV = false, hasExpected = false;
  for (const r of rs) {
    hist[r.committed] = (hist[r.committed] || 0) + 1;
    if (r.expected != null) {
      expSum += r.expected;
      expN += 1;
      hasExpected = true;
    }
    if (r.draftKv && r.draftKv.before != null) hasDraftKV = true;
  }
  const tel = ev.telemetry || null;
  const drafting = rs.filter((r) => r.drafter);
  return {
    ...s, tokens: seqPush(EMPTY_SEQ, toks), rounds: seqPush(EMPTY_SEQ, rs), trees: seqPush(EMPTY_SEQ, rs.filter((r) => r.tree)),
    cur: null, tel, hist, expSum, expN,
    memory: memorySummary(tel) || s.memory,
    lastDrafter: drafting.length ? drafting[drafting.length - 1].drafter : null,
    byDrafter: tel && tel.by_drafter ? tel.by_drafter : {},
    hasDraftKV, hasExpected, strategy: ev.strategy || s.strategy, knobs: ev.knobs || s.knobs,
    posAcc: tel && tel.per_position_acceptance ? tel.per_position_acceptance : [],
    posTries: tel && tel.per_position_tries ? tel.per_position_tries : [],
    finished: ev.finished ? { kind: "finished", round: N, reason: ev.finished,
      n_generated: (ev.position || 0) - (s.started ? (s.started.prompt_tokens || []).length : 0) } : null,
    rewinds: s.rewinds + 1, rewound: ev,
  };
}

/**
 * A batched run's figures after one more step (a batch_step event: specviz/decoding/events.py BatchStepped):
 * `steps` one summary per step (`step`, `nParallel`, `decodeMs`, `queued`, `busy` sequences in its decode,
 * `rows` in it, and `lanes`, one per request that ran a round: `slot`, `request`, `round`, `position`, `rows`,
 * `drafted`, `accepted`, `committed`, `finished`), the slots, the decodes and busy sequences summed (their
 * ratio is the server's busy slots per decode), the most busy at once, and the requests seen: `followed`,
 * the smallest id, is the request whose tokens the stream shows (specviz/ui/batch_stream.py).
 */
export function batchStep(b, ev) {
  const lanes = (ev.lanes || []).map((l) => ({ slot: l.slot, request: l.request, round: l.round, position: l.position,
    rows: l.rows || 0, drafted: l.drafted || 0, accepted: l.accepted || 0, committed: l.committed || 0,
    finished: l.finished ?? null }));
  const busy = lanes.filter((l) => l.rows > 0).length;
  const rows = lanes.reduce((a, l) => a + l.rows, 0);
  const step = { step: ev.round, nParallel: ev.n_parallel || 0, decodeMs: (ev.decode_seconds || 0) * 1000,
    queued: ev.queued || 0, busy, rows, lanes };
  const prev = b || { steps: EMPTY_SEQ, nParallel: 0, decodes: 0, busySum: 0, maxBusy: 0, requests: [], followed: null };
  const fresh = lanes.map((l) => l.request).filter((r) => !prev.requests.includes(r));
  const requests = fresh.length ? [...prev.requests, ...new Set(fresh)].sort((x, y) => x - y) : prev.requests;
  return { steps: seqPush(prev.steps, [step]), nParallel: Math.max(prev.nParallel, step.nParallel),
    decodes: prev.decodes + (busy > 0 ? 1 : 0), busySum: prev.busySum + busy, maxBusy: Math.max(prev.maxBusy, busy),
    requests, followed: requests.length ? requests[0] : null };
}

/** `reduce` over a list of events. */
export function reduceAll(state, events) {
  let s = state;
  for (const ev of events) s = reduce(s, ev);
  return s;
}

function newRound(round) {
  return { round, draft: null, verified: null, accepted: null, rejected: null, rollbacks: { target: null, draft: null },
    checkpoints: { target: null, draft: null }, tel: null };
}

/**
 * The memory figures of a telemetry's `memory` section (specviz/decoding/machine.py), in bytes: what this
 * run holds (the target's weights and caches, the draft model's, the saved states) and what the same
 * model holds under `none` (its weights and caches only: no draft model, no checkpoints), with the
 * process's resident and peak bytes and the machine's thermal/clock figures. null without the section.
 */
export function memorySummary(tel) {
  const m = tel && tel.memory;
  if (!m || !m.target) return null;
  const t = m.target, d = m.draft;
  const part = (x) => ({ weights: x.weight_bytes || 0, kv: x.kv_bytes || 0, swa: x.swa_kv_bytes || 0,
    recurrent: x.recurrent_bytes || 0, marks: x.marks_bytes || 0 });
  const target = part(t);
  const draft = d ? part(d) : null;
  const noneParts = { weights: target.weights, kv: target.kv, swa: target.swa, recurrent: target.recurrent, draft: 0, marks: 0 };
  const runParts = { weights: target.weights, kv: target.kv, swa: target.swa, recurrent: target.recurrent,
    draft: draft ? draft.weights + draft.kv + draft.swa + draft.recurrent : 0, marks: target.marks + (draft ? draft.marks : 0) };
  return { kind: t.kind, removal: t.removal, nRsSeq: t.n_rs_seq, swaCells: t.swa_cells, run: runParts, none: noneParts,
    marks: (t.marks || 0) + (d ? d.marks || 0 : 0), rss: m.rss_bytes ?? null, peak: m.peak_rss_bytes ?? null,
    machine: tel.machine || null, cpu: cpuShare(tel) };
}

/**
 * How much of the machine the run had, from a telemetry's `cpu_share`, `n_threads` and `cpu_busy`
 * (specviz/decoding/telemetry.py; whether a share is busy is decided there, by decoding/machine_load.py's
 * rule, never here): `{share, threads, busy, text}`, or null without a share (older recordings, no rounds).
 */
export function cpuShare(tel) {
  if (!tel || tel.cpu_share == null || !tel.n_threads) return null;
  const busy = tel.cpu_busy === true;
  const text = "CPU share " + Math.round(100 * tel.cpu_share) + "% of " + tel.n_threads + " thread" +
    (tel.n_threads === 1 ? "" : "s") + (busy ? ": the machine was busy" : "");
  return { share: tel.cpu_share, threads: tel.n_threads, busy, text };
}

// The token a round's draft continues (the newest committed one: rejected tokens of earlier rounds skipped).
function pendingToken(tokens) {
  for (let i = tokens.length - 1; i >= 0; i--) {
    const t = seqAt(tokens, i);
    if (t.status !== "rejected") return { token: t.id, piece: t.piece };
  }
  return null;
}

// The round an event belongs to: the current one, or a new one when the event starts another round.
function roundOf(cur, ev) {
  return cur && cur.round === ev.round ? cur : newRound(ev.round);
}

/** Target token statuses by the accepted event's bonus_kind. */
function bonusStatus(kind) {
  return kind === "correction" ? "correction" : kind === "bonus" ? "bonus" : "plain";
}

// What a draft token keeps of its round's draft: the drafter that proposed it and, for a block draft, the block.
function draftOrigin(d) {
  if (!d) return {};
  const o = {};
  if (d.drafter) o.drafter = d.drafter;
  if (d.block) o.block = d.block;
  return o;
}

// A committed token the grammar forced (the only token it allowed there) carries `forced: true`; the
// accepted event's `forced` lists their indexes in its `tokens` (accepted draft tokens, then the target's).
function acceptedTokens(ev, draft) {
  const pieces = ev.pieces || [], toks = ev.tokens || [], dp = ev.draft_probs || [], tp = ev.target_probs || [];
  const origin = draftOrigin(draft);
  const forced = new Set(ev.forced || []);
  const mark = (j) => (forced.has(j) ? { forced: true } : {});
  const out = [];
  for (let j = 0; j < ev.n_accepted; j++) {
    out.push({ status: "accepted", id: toks[j], piece: pieces[j], round: ev.round, depth: j, draftP: dp[j], targetP: tp[j],
      pos: ev.position + j, ...origin, ...mark(j) });
  }
  if (ev.bonus_token != null) {
    out.push({ status: bonusStatus(ev.bonus_kind), id: ev.bonus_token, piece: ev.bonus_piece, round: ev.round,
      depth: ev.n_accepted, targetP: ev.bonus_prob, pos: ev.position + ev.n_accepted, ...mark(ev.n_accepted) });
  }
  return out;
}

// Every rejected token keeps the rejection (its alternatives are shown for any of them); the first one
// is the token the target refused, so it carries the target's probability of it.
function rejectedTokens(ev, draft) {
  const toks = ev.tokens || [], pieces = ev.pieces || [], dp = ev.draft_probs || [];
  const origin = draftOrigin(draft);
  return toks.map((id, j) => ({ status: "rejected", id, piece: pieces[j], round: ev.round, depth: ev.depth + j,
    draftP: dp[j], targetP: j === 0 ? ev.draft_token_target_prob : null, rejection: ev, first: j === 0, ...origin }));
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
    checkpoints: c.checkpoints || { target: null, draft: null },
    rss: tel && tel.memory ? tel.memory.rss_bytes ?? null : null,
    expected,
    expectedMean: expN ? expSum / expN : null,
    policy: d ? d.policy : null,
    // who proposed the draft (a chain's member; "" in recordings made before it was recorded)
    drafter: d && drafted > 0 ? d.drafter || s.strategy : null,
    // a block draft: its facts and the fate of each of its positions
    block: d && d.block ? { ...d.block, cells: blockPositions(d.block.positions || 0, drafted, accepted) } : null,
    // a draft tree: its nodes' fates and places and the target's choices (null for a chain)
    tree: d && d.tree ? treeRound(d, v, a, c.pending || null) : null,
  };
  const hist = s.hist.slice();
  hist[committed] = (hist[committed] || 0) + 1;
  const pos = tel && tel.per_position_acceptance;
  return {
    ...s, cur: null, rounds: seqPush(s.rounds, [r]), trees: r.tree ? seqPush(s.trees, [r]) : s.trees, hist,
    lastDrafter: r.drafter || s.lastDrafter, byDrafter: tel && tel.by_drafter ? tel.by_drafter : s.byDrafter,
    posAcc: pos ? pos : s.posAcc, posTries: pos ? tel.per_position_tries || [] : s.posTries,
    hasDraftKV: s.hasDraftKV || r.draftKv.before != null,
    hasExpected: s.hasExpected || expected != null, expSum, expN,
  };
}
