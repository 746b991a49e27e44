// CSS classes of token statuses (the browser tests and the stylesheet rely on these names).

const TOKEN_CLASS = { prompt: "sv-prompt", accepted: "sv-acc", bonus: "sv-bonus", correction: "sv-corr", plain: "sv-plain",
  rejected: "sv-rej" };

/** The CSS class of a token's status. */
export function tokenClass(t) {
  return TOKEN_CLASS[t.status] || "sv-plain";
}
