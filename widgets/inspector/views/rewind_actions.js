// Rewind and branch from the token stream: the buttons under a selected token (rewind to right after its
// round, to just before the token, or to before its round; branch after its round). Python checks them.

import { h } from "../dom.js";
import { branchMessage, rewindToPosition, rewindToRound } from "../messages.js";

/** A function `(token) → element | null` for the detail panel; `getConfig()` says what is allowed now. */
export function rewindActions(send, getConfig) {
  return (t) => {
    const c = getConfig();
    if (c.replay || !c.can_control || !c.strategy) return null;
    const busy = !!c.running || !!c.working;
    const btn = (cls, text, title, msg) => {
      const b = h("button", { class: "sv-btn sv-mini " + cls, title, disabled: busy }, text);
      b.addEventListener("click", () => send(msg));
      return b;
    };
    const out = [];
    if (t.status === "prompt") {
      out.push(btn("sv-rewind-round", "⟲ Rewind to the start", "back to right after the prompt (round 0)", rewindToRound(0)));
      out.push(btn("sv-branch", "⇉ Branch from the start", "a second lane from round 0", branchMessage(0)));
    } else {
      const r = t.round;
      if (t.status !== "kept") {
        out.push(btn("sv-rewind-round", "⟲ Rewind to after round " + r, "back to the state right after round " + r, rewindToRound(r)));
      }
      if (t.status !== "rejected" && t.pos != null) {
        out.push(btn("sv-rewind-pos", "⟲ Rewind to before this token", "cut the history at position " + t.pos, rewindToPosition(t.pos)));
      }
      if (r >= 1) out.push(btn("sv-rewind-before", "⟲ to before round " + r, "back to the state right after round " + (r - 1), rewindToRound(r - 1)));
      const at = t.status === "kept" ? r - 1 : r;
      out.push(btn("sv-branch", "⇉ Branch after round " + at, "a second lane from the state right after round " + at + ", to try another setting",
        branchMessage(at)));
    }
    return h("div", { class: "sv-actions" }, ...out);
  };
}
