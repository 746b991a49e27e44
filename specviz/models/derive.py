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
from typing import Sequence

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
    from gguf import GGUFReader, GGUFValueType

    target_path = Path(target_path)
    out_path = Path(out_path)
    if not target_path.is_file():
        raise ModelNotFoundError(f"target model {str(target_path)!r} does not exist; pass the path of a GGUF file")
    if out_path.resolve() == target_path.resolve():
        raise KnobError(
            f"-o {str(out_path)!r} is the target itself; choose another output path", knob="-o", value=str(out_path)
        )
    try:
        reader = GGUFReader(str(target_path), "r")
    except Exception as exc:  # gguf raises ValueError / struct errors on bad files
        raise ModelFormatError(
            f"{str(target_path)!r} is not a readable GGUF file ({exc}); check the "
            "path and that the download is complete"
        ) from exc

    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise ModelFormatError(f"{str(target_path)!r} has no general.architecture key")
    arch = str(arch_field.contents())
    bc_key = f"{arch}.block_count"
    if bc_key not in reader.fields:
        raise ModelFormatError(
            f"{str(target_path)!r} has no {bc_key} key; derive-draft needs a transformer with numbered blocks"
        )
    n_layer = int(reader.fields[bc_key].contents())

    if isinstance(keep_layers, str):
        keep = parse_layers(keep_layers, n_layer)
    else:
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

    nextn = reader.fields.get(f"{arch}.nextn_predict_layers")
    if nextn is not None and int(nextn.contents()) > 0:
        raise ModelFormatError(
            f"{str(target_path)!r} has {int(nextn.contents())} multi-token "
            "prediction layers stored as trailing blocks; derive-draft cannot "
            "subset such a model"
        )

    new_index = {old: new for new, old in enumerate(keep)}
    writer = raw_writer_class()(str(out_path) + ".part", arch)
    subset_keys: list[str] = []
    try:
        align = reader.fields.get("general.alignment")
        if align is not None:
            writer.data_alignment = int(align.contents())
        for key, f in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture" or not f.types:
                continue
            if (
                key == f"{arch}.attention.sliding_window_pattern"
                and arch in _WRITES_SWA_PATTERN
                and f.types[0] != GGUFValueType.ARRAY
            ):
                continue  # replaced below by an explicit per-layer array
            if key == bc_key:
                writer.add_key_value(key, len(keep), f.types[0])
                continue
            vtype = f.types[0]
            per_layer = vtype == GGUFValueType.ARRAY and key.startswith(arch + ".") and len(f.data) == n_layer
            if reader.byte_order == "I" and key != "general.name" and not per_layer:
                # unchanged: copy the stored bytes (parts 0-2 are key length, key and value type)
                payload = b"".join(p.tobytes() for p in f.parts[3:])
                writer.add_key_value(
                    key,
                    RawValue(payload, max(1, len(f.data))),
                    vtype,
                    f.types[-1] if vtype == GGUFValueType.ARRAY else None,
                )
                continue
            value, vtype, sub = _field_value(f)
            if vtype == GGUFValueType.ARRAY:
                if len(value) == 0:
                    continue  # GGUFWriter cannot write an empty array; llama.cpp treats absent alike
                if key.startswith(arch + ".") and len(value) == n_layer:
                    value = [value[i] for i in keep]
                    subset_keys.append(key)
            if key == "general.name":
                value = f"{value} {name_suffix or '(layers ' + _compact(keep) + ')'}"
            writer.add_key_value(key, value, vtype, sub)
        period = swa_period(arch)
        pattern_key = f"{arch}.attention.sliding_window_pattern"
        pf = reader.fields.get(pattern_key)
        swa_pattern: tuple[bool, ...] | None = None
        if arch in _WRITES_SWA_PATTERN and period and (pf is None or pf.types[0] != GGUFValueType.ARRAY):
            swa_pattern = tuple(old % period != period - 1 for old in keep)
            writer.add_key_value(pattern_key, list(swa_pattern), GGUFValueType.ARRAY, GGUFValueType.BOOL)
        writer.add_key_value(
            "specviz.derived.source_name",
            str(reader.fields["general.name"].contents()) if "general.name" in reader.fields else target_path.name,
            GGUFValueType.STRING,
        )
        writer.add_key_value("specviz.derived.source_block_count", n_layer, GGUFValueType.UINT32)
        writer.add_key_value("specviz.derived.kept_layers", list(keep), GGUFValueType.ARRAY, GGUFValueType.UINT32)

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
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        Path(str(out_path) + ".part").replace(out_path)
    except BaseException:
        try:
            writer.close()
        except Exception:
            pass
        Path(str(out_path) + ".part").unlink(missing_ok=True)
        raise

    mismatches: list[tuple[int, int]] = []
    if period and swa_pattern is None and pattern_key not in subset_keys:
        mismatches = [
            (old, new) for new, old in enumerate(keep) if (old % period == period - 1) != (new % period == period - 1)
        ]
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
