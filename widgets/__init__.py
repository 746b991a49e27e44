"""The inspector's front-end (ESM + CSS), shipped inside the package as ``specviz.static``."""
