"""Typed errors raised by specviz.

Every error says what was wrong and what to do about it. A call that raises one of these leaves the
session exactly as it was before the call.
"""

from __future__ import annotations


class SpecvizError(Exception):
    """Base class of every error specviz raises on purpose."""


class ModelError(SpecvizError):
    """A model file could not be used."""


class ModelNotFoundError(ModelError, FileNotFoundError):
    """The model path does not exist."""


class ModelFormatError(ModelError, ValueError):
    """The file exists but is not a loadable GGUF (wrong magic, truncated, unsupported)."""


class EmbeddedModelError(ModelError):
    """The embedded default model is not installed or failed its checksum."""


class ContextError(SpecvizError):
    """A llama.cpp context could not be created or used (capacity, decode failure)."""


class KnobError(SpecvizError, ValueError):
    """A knob value is unknown, of the wrong type or outside its range. Nothing was changed."""

    def __init__(self, message: str, *, knob: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.knob = knob
        self.value = value


class GrammarError(KnobError):
    """A grammar (GBNF) llama.cpp cannot parse or a JSON schema its converter cannot convert, refused before
    anything changed; or, mid-generation, a position where the grammar allows no token of the vocabulary (the
    round commits nothing; the generation cannot go on past it). ``reason`` is llama.cpp's (or the
    converter's) own, ``line`` the 1-based line of the grammar or schema it points at (None where it points at
    none), ``position`` the history position a mid-generation refusal names (None otherwise)."""

    def __init__(
        self,
        message: str,
        *,
        knob: str = "grammar",
        reason: str = "",
        line: int | None = None,
        position: int | None = None,
    ) -> None:
        super().__init__(message, knob=knob)
        self.reason = reason
        self.line = line
        self.position = position


class StrategyError(KnobError):
    """The strategy name is unknown or cannot be used with the given models."""


class OptionConflictError(KnobError):
    """Two options cannot be honoured together (for example sampling with a greedy-only flag)."""


class ContextSettingsError(KnobError, ContextError):
    """A context setting (flash attention, a KV cache type, a context or batch size, threads) is refused:
    unknown, out of range, or impossible with the other settings or the model. Nothing was created."""


class SequenceError(ContextError, ValueError):
    """A multi-sequence request a context cannot serve, refused before llama.cpp sees it: no sequences, a
    sequence id outside the context's, a sequence twice in one batch, its tokens past its share of the
    context or not continuing its cache, a batch over ``n_batch``; or a memory kind that cannot cut one
    sequence alone (``kind``, else None). Nothing was changed."""

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class BatchError(SpecvizError, ValueError):
    """A batched run (:mod:`specviz.decoding.batch`) refused: a slot count below 1, or a strategy that cannot
    share the target context with other requests. Nothing was changed."""


class SessionStateError(SpecvizError, RuntimeError):
    """The call does not fit the session's state (for example step() before start())."""


class RewindError(SessionStateError, ValueError):
    """A rewind to a round or position outside the committed range (or before the session began). Nothing
    was changed."""


class ChatTemplateError(SpecvizError, ValueError):
    """The model has no chat template (or llama.cpp cannot apply it), or the messages are malformed."""


class SnapshotError(SpecvizError, ValueError):
    """A snapshot envelope is corrupted, truncated or belongs to other models."""


class VocabularyMismatchError(ModelError):
    """A draft model's vocabulary differs from the target's."""


class StrategyUnavailableError(StrategyError, ModelError):
    """A strategy cannot run with these models, and why (an EAGLE-3 head that does not fit the target, a
    target without NextN layers, a graph whose hidden states cannot be read). Raised by ``configure()``
    and ``start()`` before anything changes, never mid-run."""


class CaptureUnavailableError(StrategyUnavailableError):
    """The target's layer inputs cannot be read: its graph records none and no capture shim applies, the
    shim could not be built, or the llama.cpp build lacks the staging API."""


class RollbackUnavailableError(StrategyUnavailableError):
    """The target's (or a draft model's) memory cannot drop a rejected tail in any way llama.cpp offers:
    neither partial removal nor a partial-state checkpoint (see :mod:`specviz.backends.memory`). Raised when a
    drafting strategy is configured or started, before anything changes; ``none`` still runs."""


class RingCoverageError(RewindError):
    """A rewind asked for a position whose keys the sliding-window ring (``swa_full=False``) has already
    overwritten: the forward that would restart there cannot see its whole window. Nothing was changed."""


class LlamaServerError(SpecvizError, RuntimeError):
    """llama-server could not be found, started or asked (no binary built, it exited at start, a request
    failed); the message says which, with the end of the server's log where there is one."""


class RecordingError(SpecvizError, ValueError):
    """A recording (or a session's events) does not hold what was asked of it (for example per-position
    acceptance from a recording in which nothing was drafted); the message says what is missing and what
    to record instead."""
