"""llama.cpp's grammar sampler, as llama-cpp-python binds it: a GBNF grammar compiled by llama.cpp itself, and
a JSON schema converted to GBNF by llama-cpp-python's port of llama.cpp's converter.

- :func:`check_gbnf` parses a grammar without a vocabulary (no model needed: a refusal comes before any
  weights load) and raises :class:`~specviz.errors.GrammarError` with llama.cpp's reason and the line it
  points at; :func:`gbnf_from_json_schema` converts a schema (text or a parsed object) or raises the same.
- :class:`GrammarSampler` is one grammar state on a model's vocabulary (``llama_sampler_init_grammar``):
  :meth:`~GrammarSampler.allows` asks about one token (an array of one candidate, as llama.cpp's
  ``common_sampler`` checks its chosen token first), :meth:`~GrammarSampler.allowed` about a few chosen
  ones in one pass, :meth:`~GrammarSampler.mask` sets every token the grammar forbids to −∞ in a logits
  row in place (the whole vocabulary: tens of milliseconds on a 262k vocabulary),
  :meth:`~GrammarSampler.accept` advances the state, :meth:`~GrammarSampler.clone` copies it.

llama.cpp aborts the process when a grammar accepts a token it forbids (a C++ exception through the C API),
so :meth:`~GrammarSampler.accept` asks :meth:`~GrammarSampler.allows` first and refuses with a typed error.
End-of-generation tokens are allowed only where the grammar may end, as in llama.cpp; a token with no text
is never allowed.
"""

from __future__ import annotations

import ctypes
import json
import re
import weakref
from typing import Any

import numpy as np

from ..errors import GrammarError
from .binding import ensure_backend, llama_lib, llama_output

__all__ = ["GRAMMAR_FLAGS", "GrammarSampler", "check_gbnf", "gbnf_from_json_schema", "grammar_of_flag"]

#: llama.cpp's ``llama_token_data`` (id, logit, p), as numpy lays it out.
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
_ROOT = b"root"


def _located(source: str, said: str) -> tuple[str, int | None]:
    """llama.cpp's parse error ``said`` (its log and stderr) as one reason and the 1-based line of ``source``
    it points at: its ``... at <rest of the source>`` names the place, an undefined rule its first use."""
    text = "\n".join(said.splitlines())
    marker = "error parsing grammar: "
    if marker in text:
        text = text.split(marker, 1)[1]
        echo = "\n\n" + source.rstrip("\n")  # the parser echoes the whole source after its reason
        if echo.strip() and echo in text:
            text = text[: text.rindex(echo)]
    elif text.strip():
        text = text.strip().splitlines()[-1]
    if "unexpected end of input" in text:
        return text.strip(), source.count("\n") + 1
    at = text.find(" at ")
    if at >= 0:
        rest = text[at + 4 :]
        if rest and source.endswith(rest):
            offset = len(source) - len(rest)
            shown = rest.splitlines()[0] if rest.strip() else "(end of input)"
            return f"{text[:at]} at {shown!r}", source.count("\n", 0, offset) + 1
        if not rest.strip():
            return f"{text[:at]} at the end of the grammar", source.count("\n") + 1
    text = text.strip() or "llama.cpp could not parse the grammar"
    undefined = re.search(r"Undefined rule identifier '([^']+)'", text)
    if undefined:
        name = re.escape(undefined.group(1))
        for n, line in enumerate(source.splitlines(), 1):
            if re.search(rf"(?<![\w-]){name}(?![\w-])", line) and not re.match(rf"\s*{name}\s*::=", line):
                return text, n
    return text, None


def check_gbnf(gbnf: str, *, knob: str = "grammar") -> None:
    """Parse ``gbnf`` with llama.cpp's own parser (no vocabulary: no model is needed) and raise
    :class:`~specviz.errors.GrammarError` (``knob`` names the option) with llama.cpp's reason and the line it
    points at when it refuses it; the root rule is ``root``, as in llama.cpp's tools."""
    if not isinstance(gbnf, str) or not gbnf.strip():
        raise GrammarError(f"{knob}: the grammar is empty; give GBNF text with a 'root' rule", knob=knob)
    if "\x00" in gbnf:
        raise GrammarError(f"{knob}: the grammar holds a NUL character; remove it", knob=knob, reason="NUL")
    ensure_backend()
    lc = llama_lib()
    with llama_output() as said:
        smpl = lc.llama_sampler_init_grammar(None, gbnf.encode("utf-8"), _ROOT)
    if smpl:
        lc.llama_sampler_free(smpl)
        return
    reason, line = _located(gbnf, "\n".join(said))
    where = f" (line {line}: {gbnf.splitlines()[line - 1].strip()!r})" if line is not None else ""
    raise GrammarError(
        f"{knob}: llama.cpp refused the grammar: {reason}{where}; fix the GBNF "
        "(llama.cpp's grammars/README.md describes it)",
        knob=knob,
        reason=reason,
        line=line,
    )


def gbnf_from_json_schema(schema: str | dict[str, Any], *, knob: str = "json_schema") -> str:
    """The GBNF grammar of a JSON schema (text, or the parsed object), converted by llama-cpp-python's
    ``json_schema_to_gbnf`` (its port of llama.cpp's converter) and checked by :func:`check_gbnf`. A schema
    that is not JSON, or one the converter cannot convert, raises :class:`~specviz.errors.GrammarError`
    with the converter's reason (and, for malformed JSON, its line)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(
            f"{knob}: the schema is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}); fix the JSON",
            knob=knob,
            reason=exc.msg,
            line=exc.lineno,
        ) from None
    if not isinstance(parsed, dict):
        raise GrammarError(
            f"{knob}: a JSON schema is an object, not {type(parsed).__name__}; give an object such as "
            '{"type": "object", "properties": {...}}',
            knob=knob,
            reason="not an object",
        )
    try:
        gbnf = json_schema_to_gbnf(text)
    except Exception as exc:  # the converter raises what its code meets: ValueError, KeyError, TypeError ...
        reason = f"{type(exc).__name__}: {exc}"
        raise GrammarError(
            f"{knob}: llama-cpp-python's converter could not convert the schema ({reason}); simplify the schema "
            "or give the grammar as GBNF (--grammar)",
            knob=knob,
            reason=reason,
        ) from None
    check_gbnf(gbnf, knob=knob)
    return gbnf


#: llama.cpp's grammar options (common/arg.cpp, llama-server and the CLI alike): what each one's value is.
GRAMMAR_FLAGS = {
    "--grammar": "grammar",
    "--grammar-file": "grammar file",
    "-j": "schema",
    "--json-schema": "schema",
    "-jf": "schema file",
    "--json-schema-file": "schema file",
}


def grammar_of_flag(flag: str, value: str) -> str:
    """The checked GBNF that llama.cpp's option ``flag`` (one of :data:`GRAMMAR_FLAGS`) with ``value`` gives:
    the grammar itself, a grammar file, a JSON schema or a schema file. A file that cannot be read, a grammar
    llama.cpp refuses or a schema the converter refuses raises :class:`~specviz.errors.GrammarError` naming
    the option."""
    kind = GRAMMAR_FLAGS[flag]
    knob = "json_schema" if "schema" in kind else "grammar"
    text = value
    if kind.endswith("file"):
        try:
            with open(value, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise GrammarError(
                f"option {flag}: cannot read {value!r} ({exc}); pass the path of a UTF-8 text file",
                knob=knob,
                reason=str(exc),
            ) from None
    try:
        if "schema" in kind:
            return gbnf_from_json_schema(text)
        check_gbnf(text)
        return text
    except GrammarError as exc:
        said = str(exc).removeprefix(f"{knob}: ")  # the option names what the knob's name would
        raise GrammarError(
            f"option {flag}: {said}", knob=knob, reason=exc.reason, line=exc.line, position=exc.position
        ) from None


class _Candidates:
    """A reusable ``llama_token_data_array`` over ``n`` candidates (ids ``0 … n−1``) and one of a single
    candidate, shared by a sampler and its clones."""

    def __init__(self, n_vocab: int) -> None:
        lc = llama_lib()
        self.all = np.zeros(n_vocab, _TOKEN_DATA)
        self.all["id"] = np.arange(n_vocab, dtype=np.int32)
        ptr = self.all.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        self.all_array = lc.llama_token_data_array(data=ptr, size=n_vocab, selected=-1, sorted=False)
        self.one = np.zeros(1, _TOKEN_DATA)
        one_ptr = self.one.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        self.one_array = lc.llama_token_data_array(data=one_ptr, size=1, selected=-1, sorted=False)


class GrammarSampler:
    """One state of a grammar on a model's vocabulary (llama.cpp's grammar sampler). ``vocab`` is the model's
    ``llama_vocab`` pointer and ``n_vocab`` its size; the grammar must have passed :func:`check_gbnf` (a
    refusal here raises :class:`~specviz.errors.GrammarError` all the same). Freed by :meth:`close` or when
    collected."""

    def __init__(self, vocab: Any, n_vocab: int, gbnf: str, *, _ptr: Any = None, _cand: _Candidates | None = None):
        lc = llama_lib()
        self.gbnf = gbnf
        self.vocab = vocab
        self.n_vocab = int(n_vocab)
        if _ptr is None:
            ensure_backend()
            _ptr = lc.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), _ROOT)
            if not _ptr:  # its reason is read where it is collected, by parsing it again (stderr is not taken here)
                check_gbnf(gbnf)
                raise GrammarError("grammar: llama.cpp refused the grammar with this vocabulary", reason="refused")
        self._ptr = _ptr
        self._cand = _cand if _cand is not None else _Candidates(self.n_vocab)
        self._free = weakref.finalize(self, lc.llama_sampler_free, _ptr)

    def allows(self, token: int) -> bool:
        """Whether the grammar, in this state, allows ``token`` next (one candidate through llama.cpp's
        grammar: about 2 µs)."""
        if not 0 <= token < self.n_vocab:
            return False
        c = self._cand
        c.one["id"][0], c.one["logit"][0] = token, 0.0
        c.one_array.size, c.one_array.selected = 1, -1
        llama_lib().llama_sampler_apply(self._ptr, ctypes.byref(c.one_array))
        return bool(np.isfinite(c.one["logit"][0]))

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """Which of the tokens ``ids`` (int32, each in the vocabulary) the grammar allows next, in one pass of
        llama.cpp's grammar over just those candidates (a few microseconds for a few hundred)."""
        data = np.zeros(len(ids), _TOKEN_DATA)
        data["id"] = ids
        lc = llama_lib()
        ptr = data.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        arr = lc.llama_token_data_array(data=ptr, size=len(ids), selected=-1, sorted=False)
        lc.llama_sampler_apply(self._ptr, ctypes.byref(arr))
        return np.isfinite(data["logit"])

    def mask(self, row: np.ndarray) -> bool:
        """Set every token the grammar forbids in this state to −∞ in ``row`` (a float32 logits row of the
        whole vocabulary, written in place); False when the grammar allows no token at all."""
        c = self._cand
        c.all["logit"] = row
        c.all_array.size, c.all_array.selected, c.all_array.sorted = self.n_vocab, -1, False
        llama_lib().llama_sampler_apply(self._ptr, ctypes.byref(c.all_array))
        row[:] = c.all["logit"]
        return bool(np.isfinite(row).any())

    def accept(self, token: int) -> None:
        """Advance the state past ``token``; a token the grammar forbids here raises
        :class:`~specviz.errors.GrammarError` (llama.cpp would abort) and leaves the state as it was."""
        if not self.allows(token):
            raise GrammarError(
                f"grammar: token {token} is not allowed here; the grammar cannot advance past it",
                reason="token not allowed",
            )
        llama_lib().llama_sampler_accept(self._ptr, int(token))

    def clone(self) -> GrammarSampler:
        """An independent copy of this state (``llama_sampler_clone``)."""
        ptr = llama_lib().llama_sampler_clone(self._ptr)
        if not ptr:
            raise GrammarError("grammar: llama.cpp could not copy the grammar's state", reason="clone failed")
        return GrammarSampler(self.vocab, self.n_vocab, self.gbnf, _ptr=ptr, _cand=self._cand)

    def close(self) -> None:
        """Free llama.cpp's sampler (idempotent)."""
        self._free()
