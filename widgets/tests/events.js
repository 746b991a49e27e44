// Hand-made events, shaped like specviz/events.py's to_dict() (only the fields the front-end reads).

export function started(over = {}) {
  return { kind: "session_started", round: 0, model: "/m/target.gguf", draft_model: null, strategy: "prompt-lookup",
    knobs: { draft_max: 4 }, prompt_tokens: [2, 10, 11], prompt_pieces: ["<bos>", "a", " b"], max_tokens: 32,
    n_ctx: 512, n_batch: 64, n_ubatch: 64, n_swa: 0, n_vocab: 320, ...over };
}

export function drafted(round, tokens, over = {}) {
  return { kind: "draft_proposed", round, tokens, pieces: tokens.map((t) => "d" + t), probs: tokens.map(() => null),
    seconds: 0.002, requested: 4, limit: 4, cap: null, reason: null, position: 0, policy: "fixed", expected_tokens: null, ...over };
}

export function verified(round, kvBefore, kvPeak, over = {}) {
  return { kind: "verified", round, tokens: [], pieces: [], probs: [], seconds: 0.02, batch_size: kvPeak - kvBefore,
    kv_before: kvBefore, kv_peak: kvPeak, draft_kv_before: null, draft_kv_peak: null, ...over };
}

/** `accepted` draft tokens then the target's `bonus` token of `kind` (bonus, correction, plain). */
export function accepted(round, acc, bonus, kind, position, over = {}) {
  const tokens = bonus == null ? acc : [...acc, bonus];
  return { kind: "accepted", round, tokens, pieces: tokens.map((t) => "p" + t), n_accepted: acc.length,
    draft_probs: acc.map(() => 0.9), target_probs: acc.map(() => 0.8), bonus_token: bonus,
    bonus_piece: bonus == null ? null : "p" + bonus, bonus_prob: bonus == null ? null : 0.7, bonus_kind: bonus == null ? null : kind,
    position, ...over };
}

export function rejected(round, depth, tokens, targetToken, over = {}) {
  return { kind: "rejected", round, depth, tokens, pieces: tokens.map((t) => "r" + t), draft_probs: tokens.map(() => 0.4),
    target_token: targetToken, target_piece: "p" + targetToken, target_prob: 0.6, draft_token_target_prob: 0.05,
    alternatives: [{ token: targetToken, piece: "p" + targetToken, prob: 0.6 }, { token: tokens[0], piece: "r" + tokens[0], prob: 0.05 }],
    position: 0, ...over };
}

export function rollback(round, context, from, to) {
  return { kind: "kv_rollback", round, context, from_pos: from, to_pos: to };
}

export function telemetry(round, data = {}) {
  return { kind: "telemetry", round, data: { rounds: round, n_generated: 0, acceptance_rate: 0.5, tokens_per_second: 100,
    tokens_per_round: 2, kv: null, per_position_acceptance: [], per_position_tries: [], draft_buckets: [], ...data } };
}

export function knobsChanged(round, strategy, knobs) {
  return { kind: "knobs_changed", round, strategy, knobs, previous_strategy: "", previous_knobs: {}, schema: [] };
}

export function finished(round, reason, nGenerated) {
  return { kind: "finished", round, reason, n_generated: nGenerated, message: null };
}

/**
 * A whole session: the prompt (3 tokens), then
 *  round 1: draft [20, 21, 22], 2 accepted, 22 rejected, correction 30; target KV 2 → 6 → 5;
 *  round 2: draft [23, 24], both accepted, bonus 31; target KV 5 → 8, nothing rolled back;
 *  round 3: no draft, plain token 32; target KV 8 → 9.
 */
export function session() {
  return [
    started(),
    drafted(1, [20, 21, 22]), verified(1, 2, 6), accepted(1, [20, 21], 30, "correction", 3),
    rejected(1, 2, [22], 30), rollback(1, "target", 6, 5),
    telemetry(1, { n_generated: 3, acceptance_rate: 2 / 3, kv: 5, per_position_acceptance: [1, 1, 0], per_position_tries: [1, 1, 1] }),
    drafted(2, [23, 24]), verified(2, 5, 8), accepted(2, [23, 24], 31, "bonus", 6),
    telemetry(2, { n_generated: 6, acceptance_rate: 0.8, kv: 8, per_position_acceptance: [1, 1, 0], per_position_tries: [2, 2, 1] }),
    drafted(3, [], { reason: "no-match" }), verified(3, 8, 9), accepted(3, [], 32, "plain", 9),
    telemetry(3, { n_generated: 7, acceptance_rate: 0.8, kv: 9 }),
  ];
}

/** A rewind to `round`, keeping `position` history tokens (`kept` ids of a round cut inside), with `tel`. */
export function rewound(round, position, over = {}) {
  return { kind: "rewound", round, position, from_round: 3, from_position: 12, n_events: 0, kept_tokens: [], kept_pieces: [],
    strategy: "prompt-lookup", knobs: { draft_max: 4 }, finished: null,
    telemetry: { rounds: round, n_generated: position - 3, acceptance_rate: 2 / 3, per_position_acceptance: [1, 1, 0],
      per_position_tries: [1, 1, 1] }, kv_rollbacks: [], ...over };
}

/** A memory_checkpoint event: `context` saved a partial state at `position` before its tokens were tested. */
export function checkpointed(round, context, position, over = {}) {
  return { kind: "memory_checkpoint", round, context, position, nbytes: 19532, seconds: 0.00002, reused: false,
    reason: "recurrent memory: llama.cpp cannot remove part of the sequence", ...over };
}

/** A kv_rollback that took `path` (truncate, partial, checkpoint, reprefill) with its cost. */
export function rollbackVia(round, context, from, to, path, over = {}) {
  return { ...rollback(round, context, from, to), path, seconds: 0.0004, nbytes: path === "checkpoint" ? 19532 : 0,
    mark_pos: path === "checkpoint" ? over.mark_pos ?? null : null, reapplied: 0, ...over };
}

/** A telemetry `memory` section (specviz/decoding/machine.py) for a recurrent target and an optional draft. */
export function memoryTelemetry(over = {}, draft = null) {
  return { memory: { target: { kind: "recurrent", removal: "full", n_rs_seq: 0, n_swa: 0, swa_full: true, cells: 0, swa_cells: 0,
    kv_bytes: 0, swa_kv_bytes: 0, state_bytes: 19532, recurrent_bytes: 19532, weight_bytes: 425728, marks: 2, marks_bytes: 39064,
    ...over }, draft, rss_bytes: 300 << 20, peak_rss_bytes: 310 << 20 },
  machine: { thermal_c: { available: false, value: "not available", why: "this machine exposes no thermal zones" },
    cpu_mhz: { available: true, min: 2000, mean: 2400, max: 2800, samples: 3 } } };
}

/**
 * A chained session with a block drafter: the prompt (3 tokens), then
 *  round 1: ngram-mod drafts [20, 21], both accepted, bonus 30;
 *  round 2: dflash drafts a block of 6 (5 positions), 4 verified [22, 23, 24, 25]: 2 accepted, 24 refused
 *           (25 discarded with it), correction 31; the fifth position was not verified;
 *  round 3: dflash again, its whole block of 5 verified and accepted, bonus 32.
 */
export function blockSession() {
  const block = (positions) => ({ kind: "dflash", size: 6, positions, trained: 6, anchor_drafts: false, position: 0 });
  const st = "ngram-mod,dflash";
  return [
    started({ strategy: st }),
    drafted(1, [20, 21], { drafter: "ngram-mod", block: null }), verified(1, 2, 5), accepted(1, [20, 21], 30, "bonus", 3),
    telemetry(1, { by_drafter: { "ngram-mod": { drafted: 2, accepted: 2, acceptance_rate: 1 } } }),
    drafted(2, [22, 23, 24, 25], { drafter: "dflash", block: block(5) }), verified(2, 5, 10),
    accepted(2, [22, 23], 31, "correction", 6), rejected(2, 2, [24, 25], 31), rollback(2, "target", 10, 8),
    rollback(2, "draft", 13, 7),
    telemetry(2, { by_drafter: { "ngram-mod": { drafted: 2, accepted: 2 }, dflash: { drafted: 4, accepted: 2 } } }),
    drafted(3, [40, 41, 42, 43, 44], { drafter: "dflash", block: block(5) }), verified(3, 8, 14),
    accepted(3, [40, 41, 42, 43, 44], 32, "bonus", 9),
    telemetry(3, { by_drafter: { "ngram-mod": { drafted: 2, accepted: 2 }, dflash: { drafted: 9, accepted: 7 } } }),
  ];
}
