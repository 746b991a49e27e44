// A batched run's lanes, as the batch view draws them: pure functions of the reducer's `batch` (state.js
// batchStep), no DOM. One step is one decode of every busy sequence's verify batch; each slot's row shows
// the request it served and the rows it put in that decode: its pending token, then its draft, the tokens
// the target accepted first and the rejected rest after them.

import { seqAt } from "./seq.js";

/** The step index shown: `want` within [0, steps), or the newest step when `want` is null or past the end. */
export function shownStep(batch, want) {
  const n = batch ? batch.steps.length : 0;
  if (!n) return -1;
  return want == null || want >= n || want < 0 ? n - 1 : want;
}

/**
 * The cells of one lane's rows in the decode: `{kind: "pending"}` for the token it feeds (the last one it
 * committed), then one `{kind: "accepted" | "rejected", depth}` per draft token; an extra row beyond those
 * (none today) is `{kind: "other"}`. A lane that put no rows (its token was evaluated with its prompt) has none.
 */
export function laneCells(lane) {
  if (!lane || !(lane.rows > 0)) return [];
  const cells = [{ kind: "pending" }];
  for (let j = 0; j < lane.drafted && cells.length < lane.rows; j++) cells.push({ kind: j < lane.accepted ? "accepted" : "rejected", depth: j });
  while (cells.length < lane.rows) cells.push({ kind: "other" });
  return cells;
}

/**
 * Step `i` of `batch` as one row per slot: `{step, busy, rows, queued, decodeMs, slots}`, each slot
 * `{slot, idle: true}` or `{slot, request, round, position, rows, drafted, accepted, committed, finished,
 * followed, cells, text}` (`followed`: the request the token stream shows). null without such a step.
 */
export function stepLanes(batch, i) {
  const st = batch ? seqAt(batch.steps, i) : undefined;
  if (!st) return null;
  const n = Math.max(st.nParallel, batch.nParallel, ...st.lanes.map((l) => l.slot + 1));
  const bySlot = new Map(st.lanes.map((l) => [l.slot, l]));
  const slots = [];
  for (let k = 0; k < n; k++) {
    const l = bySlot.get(k);
    if (!l) {
      slots.push({ slot: k, idle: true });
      continue;
    }
    const text = l.rows > 0
      ? l.rows + " row" + (l.rows === 1 ? "" : "s") + ": " + (l.drafted ? l.accepted + "/" + l.drafted + " accepted, " : "") +
        "+" + l.committed + (l.finished ? " · finished: " + l.finished : "")
      : "no rows (its token came with its prompt)";
    slots.push({ ...l, idle: false, followed: l.request === batch.followed, cells: laneCells(l), text });
  }
  return { step: st.step, busy: st.busy, rows: st.rows, queued: st.queued, decodeMs: st.decodeMs, slots };
}

/** The batch card's subtitle: slots, steps, busy sequences per decode, and the request the stream shows. */
export function batchSummary(batch) {
  if (!batch) return "";
  const n = batch.steps.length;
  const mean = batch.decodes ? batch.busySum / batch.decodes : 0;
  return batch.nParallel + " slot" + (batch.nParallel === 1 ? "" : "s") + " · " + n + " step" + (n === 1 ? "" : "s") + " · " +
    mean.toFixed(2) + " busy sequences per decode · " + batch.requests.length + " request" + (batch.requests.length === 1 ? "" : "s") +
    (batch.followed != null ? " · the token stream shows request " + batch.followed : "");
}
