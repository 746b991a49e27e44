"""The results file: one row per (prompt, setting, repeat) in Parquet, written as tasks finish.

Parquet cannot be appended to in place, so a running sweep keeps two files:

* ``RESULTS.parquet``, rewritten whole (to a temporary file, then renamed over the old one, so a
  reader never sees half a file) at most every ``flush_seconds`` and at the end;
* ``RESULTS.parquet.journal.jsonl``, to which every finished row is appended at once (one JSON line)
  and which is emptied after each rewrite. A sweep killed at any point loses no finished row: the
  next run reads both files.

Rows are identified by (``question_id``, ``setting_key``, ``repeat``); reading keeps the first row of
each identity, so a row found in both files (a kill between a rewrite and the journal's emptying) or
delivered twice counts once. A file written with another model, token budget, grid seed or context
settings is refused
rather than mixed (:class:`ResumeError`).

Columns: ``question_id``, ``category``, ``repeat``, ``setting`` (label), ``setting_key`` (JSON
identity), ``strategy``, ``knobs`` (JSON), ``temperature``, ``seed``, ``turns``, ``prompt_format``
(``chat`` or ``plain``), ``prompt_tokens``, ``n_generated``, ``rounds`` (target verify batches),
``drafted``, ``accepted``, ``seconds`` (decode time, prompts excluded), ``tokens_per_second``,
``acceptance_rate``, ``mean_accepted_tokens`` (tokens per round, as Spec-Bench counts it; 1 for
``none``), ``none_tokens_per_second`` and ``speedup`` (against the ``none`` run of the same task),
``finish``, ``cpu_share`` (the run's CPU seconds over its decode seconds times ``n_threads``, pooled over
its turns: how much of the machine it had, NaN where not known; :mod:`specviz.decoding.machine_load`) and
``n_threads`` (llama.cpp threads); the memory columns (:mod:`specviz.backends.memory`): ``memory_kind``, ``kv_bytes``,
``swa_kv_bytes``, ``recurrent_bytes``, ``weight_bytes``, ``draft_memory_bytes`` (the draft model's
weights and caches), ``checkpoints``, ``checkpoint_bytes`` and ``restore_seconds`` (summed over the
turns, draft context included), ``marks_bytes`` (saved states held at most) and ``peak_rss_bytes`` (the
worker process's peak resident memory so far); ``tokens`` (every turn's output ids, concatenated),
``turn_lengths``, ``model``, ``max_tokens``, ``grid_seed``, ``context`` (the context settings as llama.cpp
flags: ``-fa auto -ctk f16 -ctv f16 -b 512 -ub 512``), ``grammar`` (the grammar the output obeyed,
``gbnf:`` and its SHA-256's first 12 hex digits, ``""`` without one) and ``sweep_grammar`` (the sweep-wide
one: a file is resumed with the same), ``worker`` (host:pid) and ``finished_at`` (Unix time).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import SpecvizError

#: The columns that identify a row.
KEY = ("question_id", "setting_key", "repeat")
#: Values that must agree between a results file and the sweep that resumes it.
INVARIANTS = ("model", "max_tokens", "grid_seed", "context")


class ResumeError(SpecvizError, ValueError):
    """The results file cannot be resumed by this sweep (another model, budget or seed), or is unreadable."""


def row_key(row: dict[str, Any]) -> tuple[str, str, int]:
    """The identity of a row."""
    return (str(row["question_id"]), str(row["setting_key"]), int(row["repeat"]))


def journal_path(path: str | os.PathLike) -> Path:
    """The journal beside a results file."""
    return Path(str(path) + ".journal.jsonl")


def _read_parquet_rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise ResumeError(f"{path} is not a readable Parquet file ({e}); move it away or pass another -o") from None
    rows = table.to_pylist()
    missing = [k for k in KEY if k not in table.column_names]
    if missing:
        raise ResumeError(f"{path} is not a specviz sweep results file (no column {missing[0]!r}); pass another -o")
    return rows


def _read_journal(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if not path.exists():
        return rows
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut short by a kill: everything before it is whole
    return rows


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every row of a results file and its journal, each identity once (the first one kept)."""
    p = Path(path)
    rows = (_read_parquet_rows(p) if p.exists() else []) + _read_journal(journal_path(p))
    seen: set[tuple[str, str, int]] = set()
    out = []
    for r in rows:
        k = row_key(r)
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def read_results(path: str | os.PathLike):
    """The results (journal included) as a pandas DataFrame."""
    import pandas as pd

    p = Path(path)
    if not p.exists() and not journal_path(p).exists():
        raise ResumeError(f"{path} does not exist; pass a results file written by specviz sweep")
    return pd.DataFrame(read_rows(p))


class ResultStore:
    """Rows of one sweep: those already in the file, and those added as tasks finish.

    ``invariants`` (``model``, ``max_tokens``, ``grid_seed``) must match the rows already in the file.
    Opening takes an exclusive lock on the journal, so two sweeps never write one file.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        invariants: dict[str, Any],
        *,
        flush_seconds: float = 2.0,
        missing: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self.journal = journal_path(self.path)
        self.flush_seconds = flush_seconds
        self.rows = read_rows(self.path)
        missing = missing or {}  # the value of a column that rows from before it existed stand for
        for name, want in invariants.items():
            found = sorted({str(r.get(name, missing.get(name))) for r in self.rows})
            if found and found != [str(want)]:
                raise ResumeError(
                    f"{self.path} holds rows made with {name} {', '.join(found)}, not {want}; "
                    f"resume with the same {name} or write to another -o"
                )
        self.keys = {row_key(r) for r in self.rows}
        self.resumed = len(self.rows)
        self._dirty = bool(self.journal.exists() and self.rows)
        self._last_flush = time.monotonic()
        self._fh = self.journal.open("a", encoding="utf-8")
        try:
            import fcntl

            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # pragma: no cover - not POSIX: no lock
            pass
        except OSError:
            self._fh.close()
            raise ResumeError(f"another sweep is writing {self.path}; wait for it or pass another -o") from None

    def done(self, key: tuple[str, str, int]) -> bool:
        """True when a row with this identity is already stored."""
        return key in self.keys

    def add(self, rows: Iterable[dict[str, Any]]) -> int:
        """Store finished rows (journal first, at once); returns how many were new (duplicates are dropped)."""
        new = 0
        for r in rows:
            k = row_key(r)
            if k in self.keys:
                continue
            self.keys.add(k)
            self.rows.append(r)
            self._fh.write(json.dumps(r, ensure_ascii=False, allow_nan=True) + "\n")
            new += 1
        if new:
            self._fh.flush()
            self._dirty = True
            if time.monotonic() - self._last_flush >= self.flush_seconds:
                self.flush()
        return new

    def flush(self) -> None:
        """Rewrite the Parquet file with every row (atomically), then empty the journal."""
        if not self._dirty:
            return
        import pandas as pd

        tmp = self.path.with_name(self.path.name + ".tmp")
        pd.DataFrame(self.rows).to_parquet(tmp, index=False)
        os.replace(tmp, self.path)
        self._fh.truncate(0)
        self._fh.seek(0)
        self._dirty = False
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """Final rewrite; the journal is removed once the Parquet file holds every row."""
        if self._fh.closed:
            return
        self.flush()
        self._fh.close()
        if self.path.exists() or not self.rows:
            self.journal.unlink(missing_ok=True)
