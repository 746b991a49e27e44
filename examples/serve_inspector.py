"""Serve the specviz inspector (Panel app) on the embedded Gemma 3 270M, with derived drafts ready.

Before serving, two drafts are derived from the target by keeping a subset of its layers (once; they
are kept in the specviz cache under ``derived/``):

* ``keep 0-16``: drops the last block — high next-token agreement, a good draft;
* ``keep 0-5,12-17``: drops six middle blocks — acceptance collapses (a few percent on Gemma).

Both are offered in the inspector's ``draft_model`` field when you choose the ``draft`` strategy, so a
demo can switch between n-gram drafting, a good draft model and a bad one without typing paths.

The page opens on a setting where speculation pays (quoting a given text with prompt lookup, about 3x
plain decoding), with presets one click away (:func:`specviz.ui.presets.demo_presets`): a summary where
16-token drafts lose, the cost policy on that summary, and the bad derived draft.

    python examples/serve_inspector.py [--port 5006] [--model PATH] [--no-derive] [--preset NAME]

Open http://127.0.0.1:5006/ and press Step, Run or Play. Ctrl-C stops the server.
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: Layer subsets derived for the demo: a good draft and one whose acceptance collapses.
DEMO_DRAFTS = {"0-16": "keep-0-16", "0-5,12-17": "keep-0-5_12-17"}


def derive_demo_drafts(target: Path, specs: dict[str, str] | None = None) -> list[Path]:
    """Derive the demo drafts of ``target`` into the derived-drafts cache (skipping those present)."""
    from specviz.models.derive import derive_draft
    from specviz.server.app import derived_drafts_dir

    out_dir = derived_drafts_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec, suffix in (specs or DEMO_DRAFTS).items():
        out = out_dir / f"{target.stem}-{suffix}.gguf"
        if not out.exists():
            print(f"deriving a draft from {target.name}, keeping layers {spec} → {out} …", flush=True)
            try:
                derive_draft(target, spec, out)
            except Exception as e:  # e.g. a target with fewer layers: serve without it
                print(f"  skipped: {e}")
                continue
        paths.append(out)
    return paths


def main(argv: list[str] | None = None) -> None:
    """Parse the options, derive the drafts and serve until interrupted."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=5006)
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--model", default=None, help="target GGUF (default: the embedded Gemma 3 270M)")
    ap.add_argument(
        "--preset",
        default="quote",
        help="the preset each page opens on (quote, summarise-fixed, summarise-cost, bad-draft)",
    )
    ap.add_argument("--no-derive", action="store_true", help="do not derive the demo drafts")
    a = ap.parse_args(argv)

    from specviz.models.embedded import resolve_model
    from specviz.server.app import serve
    from specviz.ui.presets import demo_presets

    target = resolve_model(a.model)
    drafts = [] if a.no_derive else derive_demo_drafts(target)
    presets = demo_presets(drafts)
    start = next((p for p in presets if p["name"] == a.preset), None)
    if start is None:
        ap.error(f"--preset: {a.preset!r} is not one of {', '.join(p['name'] for p in presets)}")
    serve(
        a.port,
        target,
        address=a.address,
        prompt=start["prompt"],
        strategy=start["strategy"],
        max_tokens=start["max_tokens"],
        draft_models=[str(p) for p in drafts],
        presets=presets,
        **start["knobs"],
    )


if __name__ == "__main__":
    main()
