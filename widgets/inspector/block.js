// Block drafts and chains of drafters, as plain data for the views (no DOM): a block's positions, the drafter
// of each round, the strategies the knob form offers.
//
// A block draft (llama.cpp's draft-dflash / draft-dspark) drafts all its positions in parallel in one
// pass, so the stream shows it as one block with the fate of each position, not as a chain of tokens:
// the DraftProposed event's `block` says how many positions the block held (`positions`), the round's
// draft how many of them were verified, and the accepted event how many the target kept.

/** Position statuses of a block, in the order of the block's legend. */
export const BLOCK_STATUSES = ["accepted", "rejected", "discarded", "unused"];

/**
 * The status of each position of a block that held `positions` draft positions, of which `drafted` were
 * verified and `accepted` kept: accepted below `accepted`, the first refused one rejected, the verified
 * ones after it discarded (never tested), the ones the round did not verify (its limit, p-min, a
 * confidence threshold) unused.
 */
export function blockPositions(positions, drafted, accepted) {
  const out = [];
  for (let i = 0; i < positions; i++) {
    out.push(i < accepted ? "accepted" : i === accepted && i < drafted ? "rejected" : i < drafted ? "discarded" : "unused");
  }
  return out;
}

/** A short description of a round's block: "dflash block of 8: 3/7 positions accepted (drafted in parallel)". */
export function blockTitle(block, drafted, accepted) {
  const conf = Array.isArray(block.confidence) && block.confidence.length
    ? " · confidence " + block.confidence.slice(0, drafted + 1).map((c) => c.toFixed(2)).join(" ") : "";
  return (block.kind || "block") + " block of " + block.size + " (trained " + block.trained + "): " + accepted + "/" +
    block.positions + " positions accepted, " + drafted + " verified, drafted in parallel" + conf;
}

/**
 * Whether a round's drafter is worth naming in the stream: it drafted and differs from the drafter of the
 * previous round that drafted (a chain switching members), or it is the first drafting round of a chain.
 */
export function drafterChanged(drafter, previous, strategy) {
  if (!drafter) return false;
  if (previous == null) return String(strategy || "").includes(",");
  return drafter !== previous;
}

/** The strategies the form offers: the registered ones, and the running one when it is a chain of them. */
export function strategyOptions(registered, current) {
  const names = registered.slice();
  if (current && !names.includes(current)) names.push(current);
  return names;
}
