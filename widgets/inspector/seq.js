// An append-only sequence that a pure reducer can extend without copying what it already holds.
//
// Items live in blocks of SEQ_BLOCK. Appending copies only the last (partial) block and the short list
// of blocks, so a state and the state before it share every full block and neither is modified:
// appending a round to a 20,000-token stream copies a few hundred references, not 20,000.
// Sequences are treated as immutable: nothing outside this file writes to `blocks`.

const SEQ_BLOCK = 256;

/** The empty sequence. */
export const EMPTY_SEQ = Object.freeze({ length: 0, blocks: Object.freeze([]) });

/** A new sequence: `seq` followed by `items` (an array); `seq` itself is unchanged. */
export function seqPush(seq, items) {
  if (!items.length) return seq;
  const blocks = seq.blocks.slice();
  let last = [];
  if (blocks.length && blocks[blocks.length - 1].length < SEQ_BLOCK) last = blocks.pop().slice(); // shared: copy it
  for (const it of items) {
    if (last.length === SEQ_BLOCK) {
      blocks.push(last);
      last = [];
    }
    last.push(it);
  }
  blocks.push(last);
  return { length: seq.length + items.length, blocks };
}

/** The item at index `i` (undefined outside [0, length)). */
export function seqAt(seq, i) {
  if (!(i >= 0 && i < seq.length)) return undefined;
  return seq.blocks[Math.floor(i / SEQ_BLOCK)][i % SEQ_BLOCK];
}

/** Items [from, to) as an array; negative indices count from the end, like Array.prototype.slice. */
export function seqSlice(seq, from = 0, to = seq.length) {
  const n = seq.length;
  const lo = Math.max(0, from < 0 ? n + from : Math.min(from, n));
  const hi = Math.max(lo, to < 0 ? n + to : Math.min(to, n));
  const out = [];
  for (let i = lo; i < hi; i++) out.push(seq.blocks[Math.floor(i / SEQ_BLOCK)][i % SEQ_BLOCK]);
  return out;
}

/** The last item (undefined when empty). */
export function seqLast(seq) {
  return seqAt(seq, seq.length - 1);
}
