// Comparison lanes: pure functions from a comparison (Python's specviz.compare.Comparison.to_dict()) to the
// aligned rows the lanes view draws, the figures table and the per-position acceptance overlay (no DOM).

/** Generated positions per aligned row, and the most positions drawn. */
export const LANE_WIDTH = 16;
export const LANE_MAX = 640;

/**
 * The two token streams aligned by generated position: `{rows, shown, total, divergence}`; each row is
 * `{start, a, b}` with one cell per position (`null` where a lane has no token): `{pos, id, piece, kind,
 * diff, first}` — `diff` where the lanes hold different tokens, `first` at the first divergence.
 */
export function alignLanes(cmp, width = LANE_WIDTH, max = LANE_MAX) {
  if (!cmp || !cmp.a || !cmp.b) return { rows: [], shown: 0, total: 0, divergence: null };
  const A = cmp.a, B = cmp.b;
  const total = Math.max(A.tokens.length, B.tokens.length);
  const shown = Math.min(total, max);
  const div = cmp.first_divergence;
  const cell = (L, i, other) => {
    if (i >= L.tokens.length) return null;
    const diff = i < other.tokens.length ? other.tokens[i] !== L.tokens[i] : false;
    return { pos: i, id: L.tokens[i], piece: L.pieces[i], kind: L.kinds[i], round: L.rounds[i], diff, first: i === div };
  };
  const rows = [];
  for (let start = 0; start < shown; start += width) {
    const a = [], b = [];
    for (let i = start; i < Math.min(start + width, shown); i++) {
      a.push(cell(A, i, B));
      b.push(cell(B, i, A));
    }
    rows.push({ start, a, b });
  }
  return { rows, shown, total, divergence: div };
}

const pctText = (x) => (x == null ? "—" : (100 * x).toFixed(1) + "%");
const numText = (x, d) => (x == null ? "—" : Number(x).toFixed(d));

/** Rows `[label, A, B, difference]` of the figures both lanes report (texts, ready to show). */
export function laneFigureRows(cmp) {
  if (!cmp || !cmp.a || !cmp.b) return [];
  const fa = cmp.a.figures || {}, fb = cmp.b.figures || {};
  const diff = (x, y, d, pct) => (x == null || y == null ? "" : (y - x >= 0 ? "+" : "") + (pct ? (100 * (y - x)).toFixed(1) + " pts" : (y - x).toFixed(d)));
  const ratio = (x, y) => (x && y ? (y / x).toFixed(2) + "×" : "");
  return [
    ["acceptance", pctText(fa.acceptance_rate), pctText(fb.acceptance_rate), diff(fa.acceptance_rate, fb.acceptance_rate, 1, true)],
    ["mean accepted length", numText(fa.mean_accepted_length, 2), numText(fb.mean_accepted_length, 2),
      diff(fa.mean_accepted_length, fb.mean_accepted_length, 2, false)],
    ["tokens/s", numText(fa.tokens_per_second, 1), numText(fb.tokens_per_second, 1), ratio(fa.tokens_per_second, fb.tokens_per_second)],
    ["rounds", numText(fa.rounds, 0), numText(fb.rounds, 0), diff(fa.rounds, fb.rounds, 0, false)],
    ["generated", String(cmp.a.tokens.length), String(cmp.b.tokens.length), diff(cmp.a.tokens.length, cmp.b.tokens.length, 0, false)],
  ];
}

/** Per-position acceptance of both lanes overlaid: two bar series by draft depth (`{note}` without drafts). */
export function laneOverlaySpec(cmp, o) {
  const p = (o && o.palette) || {};
  const pa = (cmp && cmp.a && cmp.a.figures && cmp.a.figures.per_position_acceptance) || [];
  const pb = (cmp && cmp.b && cmp.b.figures && cmp.b.figures.per_position_acceptance) || [];
  const n = Math.max(pa.length, pb.length);
  if (!n) return { note: "No draft tokens in either lane yet." };
  const xs = Array.from({ length: n }, (_, i) => i + 1);
  const axis = (range, extra) => ({ range, autorange: false, fixedrange: true, gridcolor: p.grid, zeroline: false, ticks: "", ...extra });
  return {
    legend: [["sv-sw-lane-a", "A"], ["sv-sw-lane-b", "B"]],
    data: [
      { type: "bar", x: xs, y: xs.map((_, i) => (i < pa.length ? pa[i] : null)), name: "A", marker: { color: p.slate || "#64748b" },
        hovertemplate: "A, depth %{x}: %{y:.1%}<extra></extra>" },
      { type: "bar", x: xs, y: xs.map((_, i) => (i < pb.length ? pb[i] : null)), name: "B", marker: { color: p.accent || "#4f46e5" },
        hovertemplate: "B, depth %{x}: %{y:.1%}<extra></extra>" },
    ],
    layout: { height: 200, margin: { l: 46, r: 14, t: 8, b: 36 }, autosize: !(o && o.width), width: (o && o.width) || undefined,
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", showlegend: false, barmode: "group", bargap: 0.2,
      font: { size: 11.5, color: p.fg2 }, hovermode: "closest",
      xaxis: axis([0.4, n + 0.6], { dtick: n > 20 ? 2 : 1, title: { text: "draft position", font: { size: 11 } } }),
      yaxis: axis([0, 1.05], { tickvals: [0, 0.5, 1], ticktext: ["0%", "50%", "100%"] }) },
  };
}
