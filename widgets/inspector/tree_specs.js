// A draft tree round as the tree view draws it: pure functions of a round's events (state.js keeps the result
// in the round's summary), no DOM. The events are those of specviz/decoding/events.py: DraftProposed.tree (the
// nodes: tokens, pieces, parents (-1 = the pending token), probs, depths, branches), Verified.tree_choices (the
// target's choice at each row read along the accepted path, the pending token's first) and Accepted.tree_path
// (the accepted nodes, root first).
//
// A node's fate: "accepted" on the accepted path; "rejected" where the target read its parent's row (the
// pending token or an accepted node) and chose another token; "unreached" below a rejected node, where the
// target's choice was never compared with it. Nodes sit in a column per depth and a row per branch: a node's
// row is that of the first branch through it, so branch 0 (the drafter's main line) is the top row.

/** The pending token's index in `parents`. */
export const TREE_ROOT = -1;

/** Pixels: a column per depth, a row per branch, a node's box, the target's lane above the rows. */
export const TREE_GEOMETRY = Object.freeze({ col: 112, row: 38, nodeW: 96, nodeH: 26, lane: 44, pad: 8 });

/** The branches (leaf paths, depth first, children in order) of a tree given by its `parents`. */
export function treeBranches(parents) {
  const kids = new Map([[TREE_ROOT, []]]);
  parents.forEach((p, i) => {
    kids.set(i, kids.get(i) || []);
    if (!kids.has(p)) kids.set(p, []);
    kids.get(p).push(i);
  });
  const out = [];
  const walk = (node, path) => {
    const c = kids.get(node) || [];
    if (!c.length && node !== TREE_ROOT) out.push(path);
    for (const k of c) walk(k, [...path, k]);
  };
  walk(TREE_ROOT, []);
  return out;
}

/**
 * The tree of a round, or null for a chain (no `tree` in its draft): `{round, nodes, choices, path, width,
 * depth, nAccepted, nRejected, nUnreached, pending}`. Each node `{i, token, piece, prob, parent, depth, row,
 * status, children}`; each choice (one per depth the target chose at, 1 first) `{depth, token, piece, prob,
 * alternatives: [{token, piece, prob}], kind, node, drafted}`: kind "match" where the path goes on through
 * `node`, else the round's final token's kind ("bonus" or "correction"); `drafted` the tokens the tree
 * offered there. `pending` is the pending token (`{token, piece}`, or null when unknown).
 */
export function treeRound(draft, verified, accepted, pending = null) {
  const t = draft && draft.tree;
  if (!t || !Array.isArray(t.tokens)) return null;
  const n = t.tokens.length;
  const parents = (t.parents || []).slice(0, n);
  const branches = Array.isArray(t.branches) && t.branches.length ? t.branches : treeBranches(parents);
  const path = accepted && Array.isArray(accepted.tree_path) ? accepted.tree_path.slice() : [];
  const onPath = new Set(path);
  const rowOf = new Array(n).fill(-1);
  branches.forEach((b, r) => { for (const i of b) if (rowOf[i] < 0) rowOf[i] = r; });
  const depthOf = (i) => (t.depths && t.depths[i] != null ? t.depths[i] : parents[i] === TREE_ROOT ? 1 : depthOf(parents[i]) + 1);
  const nodes = [];
  for (let i = 0; i < n; i++) {
    const p = parents[i];
    let status = "accepted";
    if (!onPath.has(i)) {
      const parentRead = p === TREE_ROOT || onPath.has(p);
      status = parentRead ? "rejected" : "unreached";
    }
    nodes.push({ i, token: t.tokens[i], piece: (t.pieces || [])[i], prob: (t.probs || [])[i] ?? null, parent: p, depth: depthOf(i),
      row: Math.max(0, rowOf[i]), status, children: [] });
  }
  for (const nd of nodes) if (nd.parent !== TREE_ROOT && nodes[nd.parent]) nodes[nd.parent].children.push(nd.i);
  const rootKids = nodes.filter((nd) => nd.parent === TREE_ROOT).map((nd) => nd.i);
  const finalKind = accepted && accepted.bonus_kind ? accepted.bonus_kind : "correction";
  const choices = ((verified && verified.tree_choices) || []).map((c, k) => {
    const at = k === 0 ? rootKids : path[k - 1] != null && nodes[path[k - 1]] ? nodes[path[k - 1]].children : [];
    const node = k < path.length ? path[k] : null;
    return { depth: k + 1, token: c.token, piece: c.piece, prob: c.prob ?? null,
      alternatives: (c.alternatives || []).map((a) => Array.isArray(a) ? { token: a[0], piece: a[1], prob: a[2] } : a),
      kind: node != null ? "match" : finalKind, node, drafted: at.map((i) => nodes[i].token) };
  });
  const count = (s) => nodes.filter((nd) => nd.status === s).length;
  return { round: draft.round, nodes, choices, path, width: branches.length, depth: Math.max(0, ...nodes.map((nd) => nd.depth)),
    nAccepted: count("accepted"), nRejected: count("rejected"), nUnreached: count("unreached"), pending };
}

/**
 * Where the view puts a tree: the canvas `{width, height}`, each node's box `{i, x, y}` (top-left, the
 * pending token's as `root`), each edge `{from, to, status, d}` (an SVG path from the parent's right edge to
 * the child's left edge, `status` the child's) and each target choice's box `{depth, x, y}` in the lane above.
 */
export function treeLayout(tr, g = TREE_GEOMETRY) {
  const x = (depth) => g.pad + depth * g.col;
  const y = (row) => g.lane + g.pad + row * g.row;
  const root = { x: x(0), y: y(0) };
  const boxes = tr.nodes.map((nd) => ({ i: nd.i, x: x(nd.depth), y: y(nd.row) }));
  const edges = tr.nodes.map((nd) => {
    const a = nd.parent === TREE_ROOT ? root : boxes[nd.parent];
    const b = boxes[nd.i];
    const x0 = a.x + g.nodeW, y0 = a.y + g.nodeH / 2, x1 = b.x, y1 = b.y + g.nodeH / 2;
    const mx = (x0 + x1) / 2;
    return { from: nd.parent, to: nd.i, status: nd.status,
      d: "M" + x0 + "," + y0 + " C" + mx + "," + y0 + " " + mx + "," + y1 + " " + x1 + "," + y1 };
  });
  const choices = tr.choices.map((c) => ({ depth: c.depth, x: x(c.depth), y: g.pad }));
  const rows = Math.max(1, tr.width);
  const cols = Math.max(tr.depth, tr.choices.length) + 1;
  return { width: x(cols) - g.col + g.nodeW + g.pad, height: y(rows) - g.row + g.nodeH + g.pad, root, boxes, edges, choices };
}

/** A one-line summary of a tree round: its branches, depth and the nodes' fates. */
export function treeSummary(tr) {
  return tr.width + " branch" + (tr.width === 1 ? "" : "es") + ", " + tr.depth + " deep, " + tr.nodes.length + " node" +
    (tr.nodes.length === 1 ? "" : "s") + ": " + tr.nAccepted + " accepted, " + tr.nRejected + " rejected, " + tr.nUnreached +
    " never reached";
}
