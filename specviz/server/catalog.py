"""The draft models a served page may use: chosen by the server's operator, picked by a page by name.

``specviz serve`` is started with draft GGUFs (``--draft-model``, and the drafts derived from the target
that it finds). A page never names a file: it picks one of these by its name (the file's stem, made
unique) or by its position in the list, and the server opens only these files. Everything a page is
shown names the drafts the same way, so no server path reaches it.

No UI library is imported here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from ..errors import KnobError

#: The longest value a page may send in the ``draft_model`` field (anything longer is refused unread).
MAX_NAME = 200


class DraftCatalog:
    """Names → paths of the draft GGUFs the server was started with (in the order given)."""

    def __init__(self, paths: Iterable[str | os.PathLike] = ()) -> None:
        self._by_name: dict[str, str] = {}
        self._by_path: dict[str, str] = {}
        for p in paths:
            path = str(p)
            key = str(Path(path).resolve())
            if key in self._by_path:
                continue
            base = Path(path).name.removesuffix(".gguf") or "draft"
            name, i = base, 2
            while name in self._by_name:
                name, i = f"{base}-{i}", i + 1
            self._by_name[name] = path
            self._by_path[key] = name

    @property
    def names(self) -> list[str]:
        """The names a page may pick, in order."""
        return list(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def path_for(self, value: object) -> str:
        """The path of the draft a page picked (a name, or its 0-based position as an int or digits).

        Anything else — a path, an unknown name — is refused with :class:`~specviz.errors.KnobError`
        naming the drafts on offer; no file is opened or looked at.
        """
        if isinstance(value, bool):
            value = None
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit() and len(value) < 6):
            i = int(value)
            if 0 <= i < len(self._by_name):
                return list(self._by_name.values())[i]
        elif isinstance(value, str) and len(value) <= MAX_NAME and value.strip() in self._by_name:
            return self._by_name[value.strip()]
        offer = ", ".join(self._by_name) if self._by_name else "none (start the server with --draft-model PATH)"
        shown = value if isinstance(value, str) and len(value) <= 60 else "(a value)"
        raise KnobError(
            f"knob 'draft_model': {shown!r} is not one of the server's draft models; choose one of: {offer}",
            knob="draft_model",
            value=None,
        )

    def name_for(self, path: Any) -> Any:
        """The name of a catalogued draft path; a name stays a name, any other path becomes its file name."""
        if not isinstance(path, str) or not path:
            return path
        if path in self._by_name:
            return path
        return self._by_path.get(str(Path(path).resolve()), Path(path).name)
