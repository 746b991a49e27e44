// Text formatting shared by the views: probabilities, numbers, token pieces, paths, knobs.

/** A probability with three decimals, "—" when there is none. */
export function fmtP(p) {
  if (p == null || Number.isNaN(p)) return "—";
  return Number(p).toFixed(3);
}

/** A number with `d` decimals, "—" when there is none. */
export function fmtN(x, d = 1) {
  if (x == null || Number.isNaN(x)) return "—";
  return Number(x).toFixed(d);
}

/** Token text with whitespace made visible: spaces as "·", tabs as "→", newlines as "↵". */
export function showPiece(piece) {
  if (piece == null || piece === "") return "∅";
  return String(piece).replace(/▁/g, " ").replace(/ /g, "·").replace(/\t/g, "→").replace(/\r/g, "␍").replace(/\n/g, "↵");
}

/** A token's visible text in quotes. */
export function quote(piece) {
  return "“" + showPiece(piece) + "”";
}

/** The last component of a file path ("" for none). */
export function basename(p) {
  if (!p) return "";
  const s = String(p).split(/[\\/]/);
  return s[s.length - 1];
}

/** Knobs as "name=value, …". */
export function knobText(knobs) {
  return Object.entries(knobs || {}).map(([k, v]) => k + "=" + v).join(", ");
}
