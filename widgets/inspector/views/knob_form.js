// The knob form: one field per knob of a strategy's schema (checkbox, choice, draft-model path with the
// host's known drafts, or text), its range beside the name and its error under it.

import { h } from "../dom.js";
import { basename } from "../format.js";

/**
 * Fill `form` with the fields of `schema` (the knob descriptions Python sends), showing `values` where
 * given and the defaults elsewhere. `draftModels` are offered for a `draft_model` field; `uid` keeps
 * element ids unique when a page shows several inspectors.
 */
export function buildKnobForm(form, schema, values, draftModels, uid) {
  form.replaceChildren();
  for (const k of schema) {
    const v = values && k.name in values ? values[k.name] : k.default;
    let inp;
    if (k.type === "bool") {
      inp = h("input", { type: "checkbox", checked: !!v });
    } else if (k.choices && k.choices.length) {
      inp = h("select", null, ...k.choices.map((c) => h("option", { value: c, selected: c === v, text: c })));
    } else if (k.name === "draft_model" && draftModels.length) {
      // a free-text path, with the host's known drafts offered (and the first one prefilled)
      const listId = "sv-drafts-" + uid;
      inp = h("input", { type: "text", list: listId, value: v ? String(v) : draftModels[0], title: "path of the draft GGUF" });
      form.append(h("datalist", { id: listId }, ...draftModels.map((d) => h("option", { value: d, text: basename(d) }))));
    } else {
      inp = h("input", { type: "text", inputmode: k.type === "str" ? "text" : "decimal", value: v == null ? "" : String(v) });
    }
    inp.classList.add("sv-input");
    const range = k.choices && k.choices.length ? "" : (k.lo != null || k.hi != null) ? "[" + (k.lo ?? "−∞") + ", " + (k.hi ?? "∞") + "]" : "";
    form.append(h("div", { class: "sv-field", "data-knob": k.name, title: k.help || "" },
      h("label", { class: "sv-lbl" }, h("span", { text: k.name }), h("span", { class: "sv-range", text: range })),
      inp, h("div", { class: "sv-field-err" })));
  }
  if (!schema.length) form.append(h("div", { class: "sv-muted", text: "this strategy has no knobs" }));
}

/** The form's values as {knob: value} (text as typed, checkboxes as booleans); clears the field errors. */
export function readKnobForm(form) {
  const knobs = {};
  for (const f of form.querySelectorAll(".sv-field[data-knob]")) {
    const inp = f.querySelector("input,select");
    knobs[f.dataset.knob] = inp.type === "checkbox" ? inp.checked : inp.value;
    f.classList.remove("sv-invalid");
    f.querySelector(".sv-field-err").textContent = "";
  }
  return knobs;
}

/** Mark the fields named in `errors` ({knob: message}) invalid with their message; clear the others. */
export function showKnobErrors(form, errors) {
  for (const f of form.querySelectorAll(".sv-field[data-knob]")) {
    const m = errors[f.dataset.knob];
    f.classList.toggle("sv-invalid", !!m);
    f.querySelector(".sv-field-err").textContent = m || "";
  }
}
