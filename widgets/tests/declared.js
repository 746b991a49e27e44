// The page protocol's declaration (widgets/protocol.json) and a checker of messages against it, for the
// node tests. The rules are the declaration's own ("rules" in protocol.json); Python applies the same
// ones to what a page sends (specviz/ui/protocol.py).
import { readFileSync } from "node:fs";

export const declaration = JSON.parse(readFileSync(new URL("../protocol.json", import.meta.url), "utf-8"));

function isType(t, v) {
  switch (t) {
    case "int": return Number.isInteger(v);
    case "number": return typeof v === "number" && Number.isFinite(v);
    case "str": return typeof v === "string";
    case "bool": return typeof v === "boolean";
    case "object": return v !== null && typeof v === "object" && !Array.isArray(v);
    case "list": return Array.isArray(v);
    case "null": return v === null;
    default: throw new Error("protocol.json: unknown type " + t);
  }
}

function fieldProblem(name, f, v) {
  const types = Array.isArray(f.type) ? f.type : [f.type];
  const ok = types.some((t) => {
    if (!isType(t, v)) return false;
    if ((t === "int" || t === "number") && ((f.min != null && v < f.min) || (f.max != null && v > f.max))) return false;
    if (t === "str" && ((f.enum && !f.enum.includes(v)) || (f.min_length != null && v.length < f.min_length) ||
      (f.max_length != null && v.length > f.max_length))) return false;
    if ((t === "list" || t === "object") && f.max_items != null && (t === "list" ? v.length : Object.keys(v).length) > f.max_items) return false;
    if (t === "list" && f.items && !v.every((x) => isType(f.items, x))) return false;
    return true;
  });
  return ok ? null : name + " = " + JSON.stringify(v) + " is not " + types.join(" or ") + " within its bounds";
}

/** The declared fields of `msg` in `direction` ("to_python" or "to_page"), or `{error}`. */
export function shapeOf(direction, msg) {
  const decl = declaration[direction][msg && msg.type];
  if (!decl) return { error: "undeclared message type " + JSON.stringify(msg && msg.type) + " " + direction };
  if (!decl.by) return { fields: decl.fields, exactlyOne: decl.exactly_one_of || [], variant: null };
  const v = msg[decl.by.field];
  const variant = decl.variants[v];
  if (!variant) return { error: msg.type + ": undeclared " + decl.by.noun + " " + JSON.stringify(v) };
  return { fields: { ...decl.fields, [decl.by.field]: { type: "str", required: true }, ...variant.fields },
    exactlyOne: variant.exactly_one_of || [], variant: v };
}

/**
 * What is wrong with `msg` against the declaration (an empty list: nothing). A page's message may carry
 * null for an optional field (absent); a field not declared is a problem both ways. With `shapeOnly`, the
 * values' types and bounds are not checked (what the page sends as the user typed it).
 */
export function problems(direction, msg, { shapeOnly = false } = {}) {
  const s = shapeOf(direction, msg);
  if (s.error) return [s.error];
  const out = [];
  for (const k of Object.keys(msg)) if (k !== "type" && !(k in s.fields)) out.push(msg.type + ": field " + k + " is not declared");
  for (const [name, f] of Object.entries(s.fields)) {
    const absent = !(name in msg) || (direction === "to_python" && msg[name] === null && !f.required);
    if (absent) {
      if (f.required) out.push(msg.type + ": required field " + name + " is missing");
      continue;
    }
    if (!shapeOnly) {
      const p = fieldProblem(name, f, msg[name]);
      if (p) out.push(msg.type + ": " + p);
    }
  }
  if (s.exactlyOne.length && s.exactlyOne.filter((n) => msg[n] != null).length !== 1) {
    out.push(msg.type + ": exactly one of " + s.exactlyOne.join(", ") + " must be given");
  }
  return out;
}

/** Every declared (type, variant) pair of a direction, as "type" or "type variant". */
export function declaredKinds(direction) {
  const out = [];
  for (const [t, d] of Object.entries(declaration[direction])) {
    if (d.by) for (const v of Object.keys(d.variants)) out.push(t + " " + v);
    else out.push(t);
  }
  return out;
}

/** The kind of a message, as declaredKinds names it. */
export function kindOf(direction, msg) {
  const d = declaration[direction][msg.type];
  return d && d.by ? msg.type + " " + msg[d.by.field] : msg.type;
}
