// Small DOM helpers: element construction and a two-column table.

/**
 * A new element. `attrs`: "class", "text" (textContent), "on<event>" listeners, anything else an
 * attribute (true → present, null/false → absent). Null children are skipped.
 */
export function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

/** A key/value table from [[key, value], …] rows. */
export function table(rows) {
  return h("table", { class: "sv-kvtable" }, ...rows.map(([k, v]) => h("tr", null, h("th", { text: k }), h("td", { text: v }))));
}
