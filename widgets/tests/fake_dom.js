// A minimal DOM for node tests of a view: elements with attributes, classes, dataset, children, text, the
// `hidden` property and listeners; `installFakeDom()` sets `globalThis.document` and `window`. Only what
// views/tree.js and dom.js use; selectors are left to `findAll(el, predicate)`.

class FakeClassList {
  constructor(el) { this.el = el; }
  get list() { return (this.el.getAttribute("class") || "").split(/\s+/).filter(Boolean); }
  contains(c) { return this.list.includes(c); }
  add(...cs) { this.el.setAttribute("class", [...new Set([...this.list, ...cs])].join(" ")); }
  remove(...cs) { this.el.setAttribute("class", this.list.filter((c) => !cs.includes(c)).join(" ")); }
  toggle(c) { if (this.contains(c)) this.remove(c); else this.add(c); }
}

const dataName = (k) => "data-" + k.replace(/[A-Z]/g, (m) => "-" + m.toLowerCase());

/** An element: `tagName`, `namespace`, attributes, `children` (elements and text strings), listeners. */
export class FakeElement {
  constructor(tag, namespace = null) {
    this.tagName = tag.toUpperCase();
    this.namespace = namespace;
    this.attrs = new Map();
    this.children = [];
    this.parent = null;
    this.listeners = {};
    this.style = {};
    this.classList = new FakeClassList(this);
    const self = this;
    this.dataset = new Proxy({}, {
      get: (_t, k) => self.getAttribute(dataName(String(k))) ?? undefined,
      set: (_t, k, v) => { self.setAttribute(dataName(String(k)), String(v)); return true; },
    });
  }
  setAttribute(k, v) { this.attrs.set(k, String(v)); }
  getAttribute(k) { return this.attrs.has(k) ? this.attrs.get(k) : null; }
  removeAttribute(k) { this.attrs.delete(k); }
  get className() { return this.getAttribute("class") || ""; }
  set className(v) { this.setAttribute("class", v); }
  get hidden() { return this.attrs.has("hidden"); }
  set hidden(v) { if (v) this.setAttribute("hidden", ""); else this.removeAttribute("hidden"); }
  get textContent() { return this.children.map((c) => (typeof c === "string" ? c : c.textContent)).join(""); }
  set textContent(v) { this.replaceChildren(String(v)); }
  append(...nodes) {
    for (const n of nodes) {
      if (n == null) continue;
      if (n instanceof FakeElement) n.parent = this;
      this.children.push(n instanceof FakeElement ? n : String(n));
    }
  }
  prepend(...nodes) { const rest = this.children; this.children = []; this.append(...nodes); this.children.push(...rest); }
  replaceChildren(...nodes) { this.children = []; this.append(...nodes); }
  addEventListener(type, fn) { (this.listeners[type] = this.listeners[type] || []).push(fn); }
  /** Call the listeners of `type` on this element and its ancestors (as a bubbling event would). */
  dispatch(type, props = {}) {
    const ev = { type, target: this, ...props };
    for (let e = this; e; e = e.parent) for (const fn of e.listeners[type] || []) fn(ev);
  }
  getBoundingClientRect() { return { left: 10, top: 10, right: 100, bottom: 30, width: 90, height: 20 }; }
}

/** Every element under `el` (itself included) for which `pred(element)` holds, in document order. */
export function findAll(el, pred) {
  const out = [];
  const walk = (e) => {
    if (pred(e)) out.push(e);
    for (const c of e.children) if (c instanceof FakeElement) walk(c);
  };
  walk(el);
  return out;
}

/** Elements under `el` with CSS class `cls`. */
export function byClass(el, cls) {
  return findAll(el, (e) => e.classList.contains(cls));
}

/** Set `globalThis.document` and `globalThis.window` to a fake document (once per test process). */
export function installFakeDom() {
  if (globalThis.document && globalThis.document.fake) return;
  globalThis.document = {
    fake: true,
    createElement: (tag) => new FakeElement(tag),
    createElementNS: (ns, tag) => new FakeElement(tag, ns),
  };
  globalThis.window = { innerWidth: 1280 };
}
