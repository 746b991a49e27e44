// Presenter mode (`specviz serve --shared`): one session that every page watches. The host's "state"
// messages then carry `role` ("presenter" or "viewer") and `audience` ({presenters, viewers}); this view
// shows a banner saying which one this page is and how many pages watch. A viewer's controls are
// disabled by the controls view (views/controls.js) from the same `role`; Python refuses a viewer's
// commands anyway. Without a role (a page with its own session, a notebook) the banner stays hidden.

import { h } from "../dom.js";

/** The banner's text for a state message with a role, or "" without one. */
export function audienceText(st) {
  if (!st || (st.role !== "presenter" && st.role !== "viewer")) return "";
  const a = st.audience || {};
  const viewers = Number.isInteger(a.viewers) ? a.viewers : 0;
  const watching = viewers === 1 ? "1 page watching" : viewers + " pages watching";
  return st.role === "presenter"
    ? "Presenting · " + watching + " · your controls drive every page"
    : "Watching the presenter's session · " + watching + " · the controls are the presenter's";
}

/** `{el, apply(stateMsg)}`: the banner above the toolbar. */
export function audienceView() {
  const el = h("div", { class: "sv-audience", hidden: true });

  function apply(st) {
    if (!st || !("role" in st)) return;
    const text = audienceText(st);
    el.textContent = text;
    el.hidden = !text;
    el.dataset.role = st.role || "";
  }

  return { el, apply };
}
