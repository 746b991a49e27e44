"""specviz: see speculative decoding happen.

A stepping decoder runs real llama.cpp models one draft/verify round at a time and publishes each round
as typed events; an inspector (JupyterLab and Panel) renders them. What a user types is importable from
here (at most 40 names); the rest from its submodule::

    import specviz
    s = specviz.Session()            # the embedded Gemma 3 270M
    s.start("def fib(n):", max_tokens=64, strategy="prompt-lookup")
    for rnd in s.run():
        ...
"""

from __future__ import annotations

# The root holds what a user types; everything else is imported from its submodule (the drafter classes
# from specviz.strategies.<family>, the event classes from specviz.decoding.events, the result types
# from their analysis modules, the error types from specviz.errors).
from . import errors
from .analysis.advise import advise
from .analysis.check_server import check_advice
from .analysis.compare import compare
from .analysis.compare_server import compare_server
from .analysis.diagnose import diagnose
from .analysis.equivalence import check_equivalence
from .analysis.llama_server import LlamaServer
from .analysis.model_info import model_info
from .analysis.server_args import parse_server_args, session_from_server_args
from .analysis.server_repro import run_like_the_server
from .backends.context_settings import ContextSettings
from .decoding.chat import apply_chat_template
from .decoding.events import event_from_dict
from .decoding.recorder import Recorder, iter_rounds, read_events
from .decoding.session import Session
from .errors import SpecvizError
from .models.embedded import default_model_path
from .strategies import strategy_class, strategy_names, strategy_schema

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
    "compare",
    "diagnose",
    "advise",
    "model_info",
    "check_equivalence",
    "strategy_names",
    "strategy_class",
    "strategy_schema",
    "Recorder",
    "read_events",
    "iter_rounds",
    "event_from_dict",
    "default_model_path",
    "apply_chat_template",
    "ContextSettings",
    "parse_server_args",
    "session_from_server_args",
    "run_like_the_server",
    "LlamaServer",
    "compare_server",
    "check_advice",
    "errors",
    "SpecvizError",
]
