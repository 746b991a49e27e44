"""Derive a draft model from a target GGUF by keeping a subset of its transformer blocks.

The derived file shares the target's vocabulary, embeddings, output head and every metadata field,
so it is a drop-in draft for that target: only the block count changes, the kept ``blk.N.*`` tensors
are renumbered ``0..len(keep)-1`` and per-layer metadata arrays are cut to the kept layers. Tensor
data is copied byte for byte with its original ggml type (quantized blocks stay quantized).

Layer-skipping drafts are cheap to make and share the target's early computation, but acceptance
collapses quickly as more blocks are removed — which makes such pairs good material for studying why
acceptance is low.

Gemma 2/3 note: llama.cpp derives their sliding-window layer pattern from the layer index (every
6th layer is global for Gemma 3, every 2nd for Gemma 2), with a different RoPE base for local and
global layers, so renumbered blocks could silently switch attention kind. For Gemma 3 the llama.cpp
bundled with llama-cpp-python 0.3.36 also reads an explicit per-layer array
``gemma3.attention.sliding_window_pattern`` (true = sliding window); :func:`derive_draft` writes it
with each kept block's original kind, so every block computes as it did in the target. For
architectures where that is not known to work (Gemma 2), blocks whose kind changes are reported in
``DerivedDraft.swa_mismatches`` with a warning; removing whole periods or trailing blocks avoids it.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from specviz.errors import KnobError, ModelFormatError, ModelNotFoundError

from .gguf_raw import RawValue, raw_writer_class

__all__ = ["parse_layers", "derive_draft", "DerivedDraft", "swa_period"]

_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")
_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")

#: llama.cpp's hard-coded sliding-window period by architecture (layer ``il`` is global when
#: ``il % period == period - 1``): the original kind of each kept block.
_SWA_PERIOD = {"gemma2": 2, "gemma3": 6}
#: Architectures whose llama.cpp loader reads ``{arch}.attention.sliding_window_pattern`` as a
#: per-layer bool array (checked on llama-cpp-python 0.3.36: the loader logs ``is_swa`` per layer).
_WRITES_SWA_PATTERN = {"gemma3"}


def swa_period(arch: str) -> int | None:
    """The index-derived sliding-window period llama.cpp uses for ``arch``, or None."""
    return _SWA_PERIOD.get(arch)


def parse_layers(spec: str, n_layer: int | None = None, *, option: str = "--keep-layers") -> tuple[int, ...]:
    """Parse a layer list such as ``"0-5,12-17"`` or ``"0,2,4"`` into a sorted tuple of indices.

    Ranges are inclusive. Duplicates, reversed ranges, empty items and (when ``n_layer`` is given)
    indices ``>= n_layer`` are refused with :class:`specviz.errors.KnobError` naming ``option`` and
    the value.
    """

    def fail(why: str) -> KnobError:
        hint = f"; the model has layers 0-{n_layer - 1}" if n_layer else ""
        return KnobError(
            f"{option} {spec!r}: {why}. Expected comma-separated indices or inclusive ranges such as '0-5,12-17'{hint}",
            knob=option,
            value=spec,
        )

    if not isinstance(spec, str) or not spec.strip():
        raise fail("no layers given")
    out: list[int] = []
    for item in spec.split(","):
        m = _RANGE.match(item)
        if not m:
            raise fail(f"cannot read {item.strip()!r}" if item.strip() else "empty item")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise fail(f"range {lo}-{hi} runs backwards")
        out.extend(range(lo, hi + 1))
    dups = sorted({x for x in out if out.count(x) > 1})
    if dups:
        raise fail(f"layer(s) {', '.join(map(str, dups))} listed twice")
    if n_layer is not None:
        bad = [x for x in out if x >= n_layer]
        if bad:
            raise fail(f"layer {bad[0]} does not exist")
    return tuple(sorted(out))


@dataclass(frozen=True)
class DerivedDraft:
    """What :func:`derive_draft` wrote."""

    path: Path  #: the written GGUF
    arch: str  #: architecture name (unchanged)
    source_layers: int  #: block count of the target
    kept: tuple[int, ...]  #: original indices of the kept blocks, in new order
    n_tensors: int  #: tensors written
    n_bytes: int  #: tensor data bytes written
    subset_keys: tuple[str, ...] = ()  #: per-layer metadata arrays cut to the kept layers
    swa_pattern: tuple[bool, ...] | None = None
    """The per-layer sliding-window array written (true = sliding window), when one was added."""
    swa_mismatches: tuple[tuple[int, int], ...] = field(default=())
    """(original index, new index) of kept blocks whose sliding-window kind changes."""

    def to_dict(self) -> dict:
        """JSON-serialisable summary."""
        return {
            "path": str(self.path),
            "arch": self.arch,
            "source_layers": self.source_layers,
            "kept": list(self.kept),
            "n_tensors": self.n_tensors,
            "n_bytes": self.n_bytes,
            "subset_keys": list(self.subset_keys),
            "swa_pattern": None if self.swa_pattern is None else list(self.swa_pattern),
            "swa_mismatches": [list(m) for m in self.swa_mismatches],
        }


def _field_value(f):
    """(value, type, sub_type) of a GGUFReader field, ready for GGUFWriter.add_key_value."""
    from gguf import GGUFValueType

    main = f.types[0]
    if main == GGUFValueType.ARRAY:
        sub = f.types[-1] if len(f.types) > 1 else None
        if sub == GGUFValueType.ARRAY:
            raise ModelFormatError(f"metadata key {f.name!r} is a nested array, which derive-draft cannot copy")
        return f.contents(), main, sub
    return f.contents(), main, None


def derive_draft(
    target_path: str | Path, keep_layers: Sequence[int] | str, out_path: str | Path, *, name_suffix: str | None = None
) -> DerivedDraft:
    """Write ``out_path``: the target GGUF keeping only the blocks listed in ``keep_layers``.

    ``keep_layers`` is a sequence of original block indices (kept in ascending order) or a spec
    string for :func:`parse_layers`. Everything else — vocabulary, embeddings, output head, norms and
    metadata — is copied unchanged, except: ``{arch}.block_count`` becomes ``len(keep_layers)``;
    metadata arrays under ``{arch}.`` whose length equals the block count (per-layer head counts,
    feed-forward sizes, sliding-window patterns...) are cut to the kept layers; for Gemma 3 an
    explicit sliding-window array keeps each block's original attention kind (see the module
    docstring); ``general.name`` gets a suffix; and ``specviz.derived.*`` keys record the source
    and the kept layers.

    Raises :class:`ModelNotFoundError` if the target is missing, :class:`ModelFormatError` if it is
    not a GGUF with ``blk.N`` tensors (or has multi-token-prediction layers, which cannot be
    subset), and :class:`KnobError` for a bad layer list. The output is written to a temporary file
    next to ``out_path`` and renamed, so a failure leaves no half-written model.
    """
    target_path = Path(target_path)
    out_path = Path(out_path)
    reader = _open_target(target_path, out_path)
    arch, n_layer = _block_count(reader, target_path)
    keep = _kept_layers(keep_layers, n_layer)
    _refuse_mtp(reader, arch, target_path)
    part = Path(str(out_path) + ".part")
    writer = raw_writer_class()(str(part), arch)
    try:
        subset_keys = _copy_metadata(reader, writer, arch, n_layer, keep, name_suffix)
        swa_pattern = _add_swa_pattern(reader, writer, arch, keep)
        _add_provenance(reader, writer, target_path, n_layer, keep)
        n_tensors, n_bytes = _copy_tensors(reader, writer, keep, target_path)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        part.replace(out_path)
    except BaseException:
        try:
            writer.close()
        except Exception:
            pass
        part.unlink(missing_ok=True)
        raise
    period = swa_period(arch)
    mismatches = _swa_mismatches(arch, keep, swa_pattern, subset_keys)
    if mismatches:
        warnings.warn(
            f"{arch}: llama.cpp sets sliding-window vs global attention by layer index (period "
            f"{period}); kept block(s) "
            + ", ".join(f"{o}->{n}" for o, n in mismatches)
            + " change kind in the derived model. Keep whole periods (e.g. 0-5,12-17) or drop "
            "trailing blocks to avoid it.",
            stacklevel=2,
        )
    return DerivedDraft(
        out_path, arch, n_layer, keep, n_tensors, n_bytes, tuple(subset_keys), swa_pattern, tuple(mismatches)
    )


def _open_target(target_path: Path, out_path: Path) -> Any:
    """A ``GGUFReader`` of the target, after checking that it exists and is not the output itself."""
    from gguf import GGUFReader

    if not target_path.is_file():
        raise ModelNotFoundError(f"target model {str(target_path)!r} does not exist; pass the path of a GGUF file")
    if out_path.resolve() == target_path.resolve():
        raise KnobError(
            f"-o {str(out_path)!r} is the target itself; choose another output path", knob="-o", value=str(out_path)
        )
    try:
        return GGUFReader(str(target_path), "r")
    except Exception as exc:  # gguf raises ValueError / struct errors on bad files
        raise ModelFormatError(
            f"{str(target_path)!r} is not a readable GGUF file ({exc}); check the "
            "path and that the download is complete"
        ) from exc


def _block_count(reader: Any, target_path: Path) -> tuple[str, int]:
    """The target's architecture and block count (a transformer with numbered blocks, or ModelFormatError)."""
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise ModelFormatError(f"{str(target_path)!r} has no general.architecture key")
    arch = str(arch_field.contents())
    bc_key = f"{arch}.block_count"
    if bc_key not in reader.fields:
        raise ModelFormatError(
            f"{str(target_path)!r} has no {bc_key} key; derive-draft needs a transformer with numbered blocks"
        )
    return arch, int(reader.fields[bc_key].contents())


def _kept_layers(keep_layers: Sequence[int] | str, n_layer: int) -> tuple[int, ...]:
    """The kept block indices: a spec string through :func:`parse_layers`, or a sequence that must be
    distinct, ascending and within the model's ``n_layer`` blocks (KnobError naming ``--keep-layers``)."""
    if isinstance(keep_layers, str):
        return parse_layers(keep_layers, n_layer)
    keep = tuple(int(x) for x in keep_layers)
    spec = ",".join(map(str, keep))
    if list(keep) != sorted(set(keep)) or not keep:
        raise KnobError(
            f"--keep-layers {spec!r}: layers must be distinct and ascending", knob="--keep-layers", value=spec
        )
    if keep[0] < 0 or keep[-1] >= n_layer:
        raise KnobError(
            f"--keep-layers {spec!r}: the model has layers 0-{n_layer - 1}", knob="--keep-layers", value=spec
        )
    return keep


def _refuse_mtp(reader: Any, arch: str, target_path: Path) -> None:
    """ModelFormatError for a model with multi-token-prediction layers (stored as trailing blocks)."""
    nextn = reader.fields.get(f"{arch}.nextn_predict_layers")
    if nextn is not None and int(nextn.contents()) > 0:
        raise ModelFormatError(
            f"{str(target_path)!r} has {int(nextn.contents())} multi-token "
            "prediction layers stored as trailing blocks; derive-draft cannot "
            "subset such a model"
        )


def _copy_metadata(
    reader: Any, writer: Any, arch: str, n_layer: int, keep: tuple[int, ...], name_suffix: str | None
) -> list[str]:
    """Copy every metadata field but the architecture (written by the writer itself) and a scalar Gemma 3
    sliding-window pattern (replaced by :func:`_add_swa_pattern`), with the block count set to the kept
    blocks'; returns the per-layer arrays cut to the kept layers."""
    from gguf import GGUFValueType

    align = reader.fields.get("general.alignment")
    if align is not None:
        writer.data_alignment = int(align.contents())
    subset_keys: list[str] = []
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or not f.types:
            continue
        if (
            key == f"{arch}.attention.sliding_window_pattern"
            and arch in _WRITES_SWA_PATTERN
            and f.types[0] != GGUFValueType.ARRAY
        ):
            continue  # replaced by an explicit per-layer array
        if key == f"{arch}.block_count":
            writer.add_key_value(key, len(keep), f.types[0])
            continue
        if _copy_field(reader, writer, key, f, arch, n_layer, keep, name_suffix):
            subset_keys.append(key)
    return subset_keys


def _copy_field(
    reader: Any, writer: Any, key: str, f: Any, arch: str, n_layer: int, keep: tuple[int, ...], name_suffix: str | None
) -> bool:
    """Copy one metadata field: an unchanged one as its stored bytes, ``general.name`` with the suffix, a
    per-layer array cut to the kept layers (then True); an empty array is left out."""
    from gguf import GGUFValueType

    vtype = f.types[0]
    per_layer = vtype == GGUFValueType.ARRAY and key.startswith(arch + ".") and len(f.data) == n_layer
    if reader.byte_order == "I" and key != "general.name" and not per_layer:
        # unchanged: copy the stored bytes (parts 0-2 are key length, key and value type)
        payload = b"".join(p.tobytes() for p in f.parts[3:])
        writer.add_key_value(
            key, RawValue(payload, max(1, len(f.data))), vtype, f.types[-1] if vtype == GGUFValueType.ARRAY else None
        )
        return False
    value, vtype, sub = _field_value(f)
    cut = False
    if vtype == GGUFValueType.ARRAY:
        if len(value) == 0:
            return False  # GGUFWriter cannot write an empty array; llama.cpp treats absent alike
        if key.startswith(arch + ".") and len(value) == n_layer:
            value, cut = [value[i] for i in keep], True
    if key == "general.name":
        value = f"{value} {name_suffix or '(layers ' + _compact(keep) + ')'}"
    writer.add_key_value(key, value, vtype, sub)
    return cut


def _add_swa_pattern(reader: Any, writer: Any, arch: str, keep: tuple[int, ...]) -> tuple[bool, ...] | None:
    """For an architecture whose loader reads a per-layer sliding-window array (Gemma 3) and whose target
    has none: write one with each kept block's original kind, and return it (else None)."""
    from gguf import GGUFValueType

    period = swa_period(arch)
    pattern_key = f"{arch}.attention.sliding_window_pattern"
    pf = reader.fields.get(pattern_key)
    if arch in _WRITES_SWA_PATTERN and period and (pf is None or pf.types[0] != GGUFValueType.ARRAY):
        swa_pattern = tuple(old % period != period - 1 for old in keep)
        writer.add_key_value(pattern_key, list(swa_pattern), GGUFValueType.ARRAY, GGUFValueType.BOOL)
        return swa_pattern
    return None


def _add_provenance(reader: Any, writer: Any, target_path: Path, n_layer: int, keep: tuple[int, ...]) -> None:
    """The ``specviz.derived.*`` keys: the source's name, its block count and the kept layers."""
    from gguf import GGUFValueType

    writer.add_key_value(
        "specviz.derived.source_name",
        str(reader.fields["general.name"].contents()) if "general.name" in reader.fields else target_path.name,
        GGUFValueType.STRING,
    )
    writer.add_key_value("specviz.derived.source_block_count", n_layer, GGUFValueType.UINT32)
    writer.add_key_value("specviz.derived.kept_layers", list(keep), GGUFValueType.ARRAY, GGUFValueType.UINT32)


def _copy_tensors(reader: Any, writer: Any, keep: tuple[int, ...], target_path: Path) -> tuple[int, int]:
    """Add every tensor but those of dropped blocks, kept blocks renumbered, with its original ggml type;
    returns (tensors, data bytes). ModelFormatError when a kept block has no tensors."""
    new_index = {old: new for new, old in enumerate(keep)}
    n_tensors = 0
    n_bytes = 0
    for t in reader.tensors:
        m = _BLK.match(t.name)
        name = t.name
        if m:
            old = int(m.group(1))
            if old not in new_index:
                continue
            name = f"blk.{new_index[old]}.{m.group(2)}"
        # the reader gives float/int tensors in numpy shape and quantized ones as uint8 rows of
        # blocks; with raw_dtype the writer keeps the original ggml type and recovers the shape.
        writer.add_tensor(name, t.data, raw_dtype=t.tensor_type)
        n_tensors += 1
        n_bytes += int(t.n_bytes)
    kept_blocks = {int(m.group(1)) for t in reader.tensors if (m := _BLK.match(t.name))}
    missing = [i for i in keep if i not in kept_blocks]
    if missing:
        raise ModelFormatError(f"{str(target_path)!r} has no tensors for block(s) {missing}")
    return n_tensors, n_bytes


def _swa_mismatches(
    arch: str, keep: tuple[int, ...], swa_pattern: tuple[bool, ...] | None, subset_keys: list[str]
) -> list[tuple[int, int]]:
    """(original, new) index of each kept block whose index-derived attention kind changes, where nothing
    written pins it (no explicit pattern added, no per-layer pattern cut to the kept layers)."""
    period = swa_period(arch)
    if not period or swa_pattern is not None or f"{arch}.attention.sliding_window_pattern" in subset_keys:
        return []
    return [(old, new) for new, old in enumerate(keep) if (old % period == period - 1) != (new % period == period - 1)]


def _compact(keep: Sequence[int]) -> str:
    """``[0,1,2,5,6]`` -> ``"0-2,5-6"``."""
    parts: list[str] = []
    start = prev = -2
    for x in keep:
        if start == -2:
            start = prev = x
        elif x == prev + 1:
            prev = x
        else:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = x
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)
