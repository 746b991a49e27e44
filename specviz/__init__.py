"""specviz: see speculative decoding happen.

A stepping decoder runs real llama.cpp models one draft/verify round at a time and publishes each round
as typed events; an inspector (JupyterLab and Panel) renders them. Everything a user needs is importable
from here::

    import specviz
    s = specviz.Session()            # the embedded Gemma 3 270M
    s.start("def fib(n):", max_tokens=64, strategy="prompt-lookup")
    for rnd in s.run():
        ...
"""

from __future__ import annotations

# compare, diagnose and advise are functions here (their modules stay importable as specviz.analysis.compare.Lane …)
from .analysis.advise import Advice, advise
from .analysis.check_server import ServerCheck, check_advice
from .analysis.compare import Comparison, compare
from .analysis.compare_server import ServerComparison, compare_server
from .analysis.diagnose import Diagnosis, diagnose
from .analysis.equivalence import check_equivalence
from .analysis.llama_server import LlamaServer
from .analysis.model_info import ModelInfo, model_info
from .analysis.server_args import ServerConfig, parse_server_args, session_from_server_args
from .analysis.server_repro import ServerLikeRun, run_like_the_server
from .backends.context_settings import ContextSettings
from .decoding.chat import apply_chat_template
from .decoding.events import (
    Accepted,
    Alternative,
    DraftProposed,
    Event,
    Finished,
    KnobsChanged,
    KVRollback,
    MemoryCheckpoint,
    Rejected,
    Rewound,
    Round,
    SessionStarted,
    TelemetryEvent,
    Verified,
    event_from_dict,
)
from .decoding.knob_schema import Knob, Schema
from .decoding.recorder import Recorder, iter_rounds, read_events
from .decoding.session import Session
from .decoding.telemetry import Telemetry
from .errors import (
    CaptureUnavailableError,
    ChatTemplateError,
    ContextError,
    ContextSettingsError,
    EmbeddedModelError,
    KnobError,
    LlamaServerError,
    ModelError,
    ModelFormatError,
    ModelNotFoundError,
    OptionConflictError,
    RewindError,
    RingCoverageError,
    RollbackUnavailableError,
    SessionStateError,
    SnapshotError,
    SpecvizError,
    StrategyError,
    StrategyUnavailableError,
    VocabularyMismatchError,
)
from .models.embedded import default_model_path
from .strategies import Draft, Drafter, DraftResources, strategy_class, strategy_names, strategy_schema
from .strategies.draft_model import DraftModelDrafter
from .strategies.eagle3 import Eagle3Drafter
from .strategies.mtp import MtpDrafter
from .strategies.ngram_cache import NgramCacheDrafter
from .strategies.ngram_map import NgramMapK4VDrafter, NgramMapKDrafter
from .strategies.ngram_mod import NgramModDrafter
from .strategies.ngram_simple import NgramSimpleDrafter
from .strategies.none import NoDrafter
from .strategies.prompt_lookup import PromptLookupDrafter

__version__ = "0.1.0"


def __getattr__(name: str):
    # The inspector pulls in the UI stack (anywidget, panel); import it only when asked for.
    if name == "Inspector":
        from .ui import Inspector

        return Inspector
    raise AttributeError(f"module 'specviz' has no attribute {name!r}")


__all__ = [
    "Session",
    "Inspector",
    "Telemetry",
    "Recorder",
    "read_events",
    "iter_rounds",
    "default_model_path",
    "check_equivalence",
    "Knob",
    "Schema",
    "Drafter",
    "Draft",
    "DraftResources",
    "NoDrafter",
    "PromptLookupDrafter",
    "NgramSimpleDrafter",
    "NgramMapKDrafter",
    "NgramMapK4VDrafter",
    "NgramModDrafter",
    "NgramCacheDrafter",
    "DraftModelDrafter",
    "Eagle3Drafter",
    "MtpDrafter",
    "model_info",
    "ModelInfo",
    "strategy_names",
    "strategy_class",
    "strategy_schema",
    "Event",
    "SessionStarted",
    "DraftProposed",
    "Verified",
    "Accepted",
    "Rejected",
    "Alternative",
    "KVRollback",
    "MemoryCheckpoint",
    "KnobsChanged",
    "TelemetryEvent",
    "Finished",
    "Rewound",
    "Round",
    "event_from_dict",
    "compare",
    "Comparison",
    "diagnose",
    "Diagnosis",
    "advise",
    "Advice",
    "apply_chat_template",
    "ContextSettings",
    "parse_server_args",
    "ServerConfig",
    "session_from_server_args",
    "run_like_the_server",
    "ServerLikeRun",
    "LlamaServer",
    "compare_server",
    "ServerComparison",
    "check_advice",
    "ServerCheck",
    "SpecvizError",
    "ModelError",
    "ModelNotFoundError",
    "ModelFormatError",
    "EmbeddedModelError",
    "ContextError",
    "RingCoverageError",
    "RollbackUnavailableError",
    "ContextSettingsError",
    "LlamaServerError",
    "KnobError",
    "StrategyError",
    "OptionConflictError",
    "SessionStateError",
    "SnapshotError",
    "RewindError",
    "ChatTemplateError",
    "VocabularyMismatchError",
    "StrategyUnavailableError",
    "CaptureUnavailableError",
]
