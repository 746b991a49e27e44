"""``python -m specviz.cli``: the ``specviz`` command."""

from .main import main

raise SystemExit(main())
