// CSS classes of token statuses (the browser tests and the stylesheet rely on these names).

const TOKEN_CLASS = { prompt: "sv-prompt", accepted: "sv-acc", bonus: "sv-bonus", correction: "sv-corr", plain: "sv-plain",
  rejected: "sv-rej", kept: "sv-kept" };

/** The class of a token the grammar forced (the only token it allowed there), beside its status's. */
export const FORCED_CLASS = "sv-forced";

/** What a forced token's tooltip says. */
export const FORCED_TITLE = "forced by the grammar";

/** The CSS classes of a token: its status's, and FORCED_CLASS where the grammar forced it. */
export function tokenClass(t) {
  return (TOKEN_CLASS[t.status] || "sv-plain") + (t.forced ? " " + FORCED_CLASS : "");
}
