// plotly.js for the charts: taken from the page if present, otherwise asked once per page from Python
// (which reads the plotly.min.js that the plotly package ships) — never from the network. A served page is
// told the bundle's address on its own server instead (a static asset its browser caches) and fetches it.

import { plotlyMessage } from "./messages.js";

/** A promise of plotly; the first view of a page without it asks its host (a "plotly" message). */
export function getPlotly(host) {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!window.__specvizPlotly) {
    let resolve;
    const p = new Promise((r) => {
      resolve = r;
    });
    p.resolve = resolve;
    window.__specvizPlotly = p;
    host.send(plotlyMessage());
  } else if (!window.__specvizPlotlyAsked) {
    host.send(plotlyMessage());
  }
  window.__specvizPlotlyAsked = true;
  return window.__specvizPlotly;
}

/** Fetch the bundle from the page's own server (`url` relative to the page, with its cookies) and install it. */
export function fetchPlotly(url) {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!window.__specvizPlotlyFetch) {
    window.__specvizPlotlyFetch = fetch(url, { credentials: "same-origin" }).then((r) => {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.text();
    }).then(installPlotly);
  }
  return window.__specvizPlotlyFetch;
}

/** Evaluate the plotly bundle a host sent, make it window.Plotly and wake every view waiting for it. */
export function installPlotly(source) {
  if (window.Plotly) return window.Plotly;
  const mod = { exports: {} };
  // The bundle is UMD: given `module` it assigns module.exports and touches no global.
  new Function("module", "exports", source)(mod, mod.exports);
  const P = mod.exports && mod.exports.newPlot ? mod.exports : mod.exports.default;
  window.Plotly = P;
  if (window.__specvizPlotly && window.__specvizPlotly.resolve) window.__specvizPlotly.resolve(P);
  return P;
}
