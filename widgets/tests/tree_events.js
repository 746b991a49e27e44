// Hand-made draft tree rounds, shaped like specviz/decoding/events.py's to_dict() (the fields the front-end reads).
import { accepted, drafted, rejected, rollback, started, telemetry, verified } from "./events.js";

// Six nodes: the main line 40 → 41 → 42, a side branch 43 → 44 under 40, and 45 beside 40 under the pending token.
export const TREE = { tokens: [40, 41, 42, 43, 44, 45], pieces: ["a", "b", "c", "d", "e", "f"], parents: [-1, 0, 1, 0, 3, -1],
  probs: [0.9, 0.8, 0.7, 0.3, 0.6, 0.2], depths: [1, 2, 3, 2, 3, 1], branches: [[0, 1, 2], [0, 3, 4], [5]] };

const choice = (token, prob, alts = []) => ({ token, piece: "p" + token, prob, alternatives: alts });

/** A tree round whose target accepts `path` and then chooses `final` (a correction); the kept branch as a chain. */
export function treeRoundEvents(round, path, kept, final, position) {
  const keptTokens = kept.map((i) => TREE.tokens[i]);
  const k = path.length;
  const choices = [...path.map((i) => choice(TREE.tokens[i], 0.6)), choice(final, 0.5, [[44, "e", 0.2], [9, "z", 0.1]])];
  return [
    drafted(round, keptTokens, { tree: TREE, probs: kept.map((i) => TREE.probs[i]) }),
    verified(round, position - 1, position + TREE.tokens.length, { tree_choices: choices, batch_size: 7 }),
    accepted(round, keptTokens.slice(0, k), final, "correction", position, { tree_path: path }),
    rejected(round, k, keptTokens.slice(k), final),
    rollback(round, "target", position + 6, position + k),
    telemetry(round, { tree: { rounds_with_branches: round, max_branches: 3, nodes_verified: 6 * round } }),
  ];
}

export function treeSession() {
  return [
    started(),
    ...treeRoundEvents(1, [0, 3], [0, 3, 4], 50, 3), // accepted 40, 43; 44 refused (the target chose 50)
    drafted(2, [60, 61]), verified(2, 5, 8), accepted(2, [60], 62, "correction", 6), rejected(2, 1, [61], 62), telemetry(2),
    ...treeRoundEvents(3, [], [0, 1, 2], 51, 8), // nothing accepted: both children of the pending token refused
  ];
}
