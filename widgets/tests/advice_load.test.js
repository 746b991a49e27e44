// The advice panel's load section: what the advisor found about the machine load its timings were taken
// under. The words are Python's (advise_load.LoadCheck.headline / text, Advice.both_figures); the front-end
// only decides what to show loudly. No DOM.
import assert from "node:assert/strict";
import test from "node:test";

import { adviceLoad } from "../inspector/views/advice.js";

function load(verdict, extra = {}) {
  return {
    verdict, rounds: 140, flagged: verdict === "quiet" ? 0 : 23, cpu_share: 0.41, n_threads: 2, scored_fresh: false, notes: [],
    headline: "the timings were taken under outside load (a burst: 23 of 140 rounds flagged); CPU share 41% of 2 threads: the machine was busy",
    text: "load: burst: 23 of 140 rounds flagged (23 by CPU share, 0 by a verify above 1.5x its batch size's lower quartile)",
    ...extra,
  };
}

test("a burst is shown with its verdict, the advisor's notes and its detail line, as Python words them", () => {
  const notes = ["the verify cost was fitted to the 117 rounds not flagged; the 23 flagged rounds' verify times were left out"];
  const a = { load: load("burst", { notes }), both_figures: [] };
  const ld = adviceLoad(a);
  assert.equal(ld.verdict, "burst");
  assert.equal(ld.attention, true);
  assert.equal(ld.headline, a.load.headline);
  assert.equal(ld.detail, a.load.text);
  assert.deepEqual(ld.notes, notes);
  assert.deepEqual(ld.figures, []);
});

test("a fresh curve's speedup and the recorded one are shown side by side, labelled by Python", () => {
  const a = {
    load: load("steady load", { scored_fresh: true }),
    both_figures: [
      { label: "on this machine now", speedup: 2.204, tokens_per_second: 180.4 },
      { label: "as recorded, under load", speedup: 1.409, tokens_per_second: 56.5 },
    ],
  };
  assert.deepEqual(adviceLoad(a).figures, [
    { label: "on this machine now", text: "2.20×" },
    { label: "as recorded, under load", text: "1.41×" },
  ]);
  assert.equal(adviceLoad(a).attention, true);
});

test("quiet timings are one muted line; a quiet check with a note about the load is not", () => {
  const quiet = { load: load("quiet", { headline: "the timings look quiet (0 of 140 rounds flagged); CPU share 95% of 2 threads" }) };
  const ld = adviceLoad(quiet);
  assert.equal(ld.attention, false);
  assert.equal(ld.verdict, "quiet");
  assert.doesNotMatch(ld.headline, /outside load|busy/);
  const note = "the fresh measurement is 2.00x slower than the recorded verify times: the machine may be busy now";
  assert.equal(adviceLoad({ load: load("quiet", { notes: [note] }) }).attention, true);
});

test("no load check, or no rounds to check: nothing", () => {
  assert.equal(adviceLoad({ load: null }), null);
  assert.equal(adviceLoad({}), null);
  assert.equal(adviceLoad(null), null);
  assert.equal(adviceLoad({ load: load("quiet", { rounds: 0 }) }), null);
});
