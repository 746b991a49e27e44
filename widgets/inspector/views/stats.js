// The telemetry cards (tokens/s, acceptance, mean accepted length, generated, rounds, KV committed;
// tokens/s marked when the run's CPU share says the machine was busy)
// and the extra figures some sessions have: the draft model's speed, the cost policy's expectation,
// what the cost policy works from and an EAGLE-3 head's vocabulary coverage.

import { h } from "../dom.js";
import { fmtN } from "../format.js";
import { cpuShare } from "../state.js";

const STATS = [
  ["tps", "tokens/s"], ["acceptance", "acceptance"], ["mal", "mean acc. length"],
  ["generated", "generated"], ["rounds", "rounds"], ["kv", "KV committed"],
];

/** `{el, clear(), update(state)}`. */
export function statsView() {
  const values = {};
  const labels = {};
  const extra = h("div", { class: "sv-extra-stats", hidden: true });
  const el = h("div", { class: "sv-stats" }, ...STATS.map(([k, label]) => {
    values[k] = h("div", { class: "sv-stat-v", text: "—" });
    labels[k] = h("div", { class: "sv-stat-l", text: label });
    return h("div", { class: "sv-stat", "data-k": k }, values[k], labels[k]);
  }), extra);

  function clear() {
    for (const k in values) values[k].textContent = "—";
    markBusy(null);
    extra.hidden = true;
    extra.replaceChildren();
  }

  function update(state) {
    if (!state.tel && !state.rounds.length) {
      clear();
      return;
    }
    const t = state.tel || {};
    values.tps.textContent = fmtN(t.tokens_per_second, 1);
    markBusy(cpuShare(t));
    values.acceptance.textContent = t.acceptance_rate == null ? "—" : (100 * t.acceptance_rate).toFixed(1) + "%";
    values.mal.textContent = fmtN(t.mean_accepted_length, 2);
    values.generated.textContent = t.n_generated == null ? "—" : String(t.n_generated);
    values.rounds.textContent = t.rounds == null ? String(state.rounds.length) : String(t.rounds);
    values.kv.textContent = t.kv == null ? "—" : String(t.kv);
    const dm = t.draft_model_tokens_per_second;
    const cost = t.policy && t.policy.name === "cost" && t.policy.acceptance_by_run_position ? t.policy : null;
    const cov = t.vocab_coverage || null;
    extra.hidden = dm == null && t.expected_tokens_per_round == null && !cost && !cov;
    extra.replaceChildren(
      ...(dm != null ? [h("span", null, h("b", { text: fmtN(dm, 0) }), " draft-model tok/s"),
        h("span", null, h("b", { text: fmtN(t.draft_model_seconds, 2) + " s" }), " in the draft model")] : []),
      ...(t.expected_tokens_per_round != null ? [h("span", null, h("b", { text: fmtN(t.expected_tokens_per_round, 2) }),
        " expected vs ", h("b", { text: fmtN(t.tokens_per_round, 2) }), " realised tokens/round")] : []),
      ...(cost ? costPolicyStats(cost) : []),
      ...(cov ? coverageStats(cov) : []));
  }

  // the tokens/s card says when the machine was busy: its figure is not this machine's quiet speed
  function markBusy(cpu) {
    const card = labels.tps.parentNode;
    card.classList.toggle("sv-busy", !!(cpu && cpu.busy));
    labels.tps.textContent = cpu && cpu.busy ? "tokens/s (busy machine)" : "tokens/s";
    if (cpu) card.title = cpu.text;
    else card.removeAttribute("title");
  }

  return { el, clear, update };
}

// a reduced draft vocabulary (EAGLE-3's d2t): how much of the target's vocabulary it holds, and how many
// committed tokens and rejected positions' target tokens it could express at all
export function coverageStats(c) {
  const pct = (x) => (x == null ? "—" : (100 * x).toFixed(x < 0.1 ? 1 : 0) + "%");
  return [
    h("span", { class: "sv-cov-vocab", title: "the draft head's vocabulary: target ids it can propose" },
      "draft vocab ", h("b", { text: c.draft_vocab + "/" + c.target_vocab }), " (" + pct(c.vocab_share) + ")"),
    h("span", { class: "sv-cov-committed", title: "committed tokens the draft vocabulary could express" },
      h("b", { text: pct(c.committed_share) }), " of committed tokens expressible"),
    h("span", { class: "sv-cov-rejected", title: "at a rejection, was the target's token in the draft vocabulary? If not, no head could have drafted it" },
      h("b", { text: pct(c.rejection_share) }), " of rejections expressible"),
  ];
}

// what the cost policy works from: the run of accepted tokens, acceptance by run position, and how
// often the drafter's prediction was right in the rounds it kept plain
function costPolicyStats(p) {
  const acc = Object.entries(p.acceptance_by_run_position).flatMap(([k, v], i) =>
    [i ? " · " : "", k + " ", h("b", { text: (100 * v).toFixed(0) + "%" })]);
  return [
    h("span", { class: "sv-policy-run" }, h("b", { text: String(p.run) }), " accepted in a row"),
    h("span", { class: "sv-policy-acc", title: "the cost policy's acceptance estimate after a run of this many accepted tokens" },
      "acceptance by run: ", ...acc),
    ...(p.shadow_tries ? [h("span", { class: "sv-policy-shadow", title: "rounds the cost policy kept plain, where the drafter's unverified prediction was checked against the target" },
      h("b", { text: p.shadow_hits + "/" + p.shadow_tries }), " plain-round predictions right")] : []),
  ];
}
