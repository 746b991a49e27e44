"""What runs on a worker: one task = one prompt, one repeat, one temperature, every setting back to back.

Each worker process loads the target model once (:func:`worker_model`, a per-process cache that the
local pool's initializer and the Dask worker plugin warm up) and keeps one :class:`~specviz.Session`
per thread over it; a task never loads a model. Draft models are loaded once per session too
(``Session.aux_model``).

Within a task, ``none`` runs first and every other setting right after it on the same worker, as
``specviz bench`` does: each speculative run is paired with a ``none`` run taken moments before it
under the same load, and its ``speedup`` is its tokens/s over that run's.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..decoding.machine_load import cpu_share
from .chat import PromptFormat, conversation_text, logged_conversation_text, prompt_tokens
from .dataset import Prompt
from .grid import Setting

_lock = threading.Lock()
_models: dict[tuple[str, int], Any] = {}
_local = threading.local()
_loads = 0  # target models loaded by this process (a task must never add one)


@dataclass(frozen=True)
class RunConfig:
    """Run-wide values every task shares: the target model, context, threads, budget and prompt format."""

    model: str
    max_tokens: int
    prompt_format: PromptFormat
    n_ctx: int = 4096
    n_threads: int | None = None  # llama.cpp threads per task; None: this host's cores / concurrent tasks
    grid_seed: int = 0
    #: the deployment's other context settings (flash_attn, cache_type_k/v, n_batch, n_ubatch) as pairs, and
    #: the model's placement (n_gpu_layers, where above 0: every worker loads the model with it)
    context: tuple[tuple[str, Any], ...] = ()
    #: the GBNF grammar every prompt's output obeys (``--grammar`` / ``-j`` ...; a prompt's own takes its place)
    grammar: str | None = None

    @property
    def n_gpu_layers(self) -> int:
        """The model's layers on a GPU build's GPU in every worker (``-ngl``; 0: on the CPU)."""
        return int(dict(self.context).get("n_gpu_layers", 0))

    @property
    def context_label(self) -> str:
        """The context settings that change the tokens, as llama.cpp flags (the ``context`` column)."""
        return context_label(dict(self.context))


#: the ``context`` column of rows from before the column existed: llama.cpp's defaults as specviz ran them
DEFAULT_CONTEXT = "-fa auto -ctk f16 -ctv f16 -b 512 -ub 512"


def grammar_label(gbnf: str | None) -> str:
    """The ``grammar`` column: ``gbnf:`` and the first 12 hex digits of the grammar's SHA-256, or ``""``
    without one (rows from before the column stand for ``""``)."""
    if gbnf is None:
        return ""
    return "gbnf:" + hashlib.sha256(gbnf.encode("utf-8")).hexdigest()[:12]


def context_label(values: dict[str, Any]) -> str:
    """``-fa auto -ctk f16 -ctv f16 -b 512 -ub 512`` for the given settings (defaults filled in), and
    ``-ngl N`` after them where the model was placed on a GPU (a GPU's kernels change the numerics, and the
    timings: a file of CPU rows is not resumed on a GPU)."""
    v = {"flash_attn": "auto", "cache_type_k": "f16", "cache_type_v": "f16", "n_batch": 512, "n_ubatch": 512, **values}
    flags: list[tuple[str, str]] = [("-fa", "flash_attn"), ("-ctk", "cache_type_k"), ("-ctv", "cache_type_v")]
    flags += [("-b", "n_batch"), ("-ub", "n_ubatch")]
    if int(values.get("n_gpu_layers", 0)) > 0:
        flags.append(("-ngl", "n_gpu_layers"))
    return " ".join(f"{flag} {v[name]}" for flag, name in flags)


@dataclass(frozen=True)
class Task:
    """One unit of work: ``settings`` run in order (``none`` first); rows are kept for ``keep`` only.

    ``none`` runs even when its row already exists (``keep`` then leaves it out): it is the partner
    the other settings' speedups are measured against.
    """

    id: str
    prompt: Prompt
    repeat: int
    temperature: float
    seed: int
    settings: tuple[Setting, ...]
    keep: tuple[str, ...]  # setting keys whose rows to return
    config: RunConfig

    @property
    def n_rows(self) -> int:
        """Rows this task returns when it succeeds."""
        return len(self.keep)


@dataclass
class TaskResult:
    """A finished task's rows and where it ran (``model_loads``: target models loaded by that process)."""

    task_id: str
    rows: list[dict[str, Any]]
    worker: str
    model_loads: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def worker_id() -> str:
    """``host:pid`` of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def worker_model(path: str, n_gpu_layers: int = 0):
    """The target model at ``path`` (with ``n_gpu_layers`` on a GPU build's GPU), loaded once per process and
    shared by its threads."""
    global _loads
    from ..backends import LlamaModel

    with _lock:
        m = _models.get((path, n_gpu_layers))
        if m is None:
            m = LlamaModel(path, n_gpu_layers=n_gpu_layers)
            _models[(path, n_gpu_layers)] = m
            _loads += 1
        return m


def model_loads() -> int:
    """How many target models this process has loaded."""
    return _loads


def _default_threads() -> int:
    """llama.cpp threads for one task: the cores this process may use over the tasks it runs at once."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    slots = 1
    try:  # on a Dask worker, its thread count is how many tasks run at once in this process
        from distributed import get_worker

        slots = max(1, get_worker().state.nthreads)
    except (ImportError, ValueError, AttributeError):
        pass
    return max(1, cores // slots)


def worker_session(config: RunConfig):
    """This thread's session over the process's model (created on first use, then reused)."""
    from ..decoding.session import Session

    key = (config.model, config.n_ctx, config.n_threads, config.context)
    sessions = getattr(_local, "sessions", None)
    if sessions is None:
        sessions = _local.sessions = {}
    s = sessions.get(key)
    if s is None:
        s = Session(
            worker_model(config.model, config.n_gpu_layers),
            n_ctx=config.n_ctx,
            n_threads=config.n_threads or _default_threads(),
            **dict(config.context),
        )
        sessions[key] = s
    return s


def warm_up(config: RunConfig) -> None:
    """Load the model in this process ahead of its first task (pool initializer, Dask worker plugin)."""
    worker_model(config.model, config.n_gpu_layers)


def local_initializer(config: RunConfig) -> None:
    """Initializer of the local pool's worker processes: ignore Ctrl-C (the driver stops them), load the model."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warm_up(config)


def _generate(session, task: Task, setting: Setting) -> dict[str, Any]:
    """Every turn of the task's prompt under ``setting``; the summed counters and the tokens."""
    p, cfg = task.prompt, task.config
    answers: list[str] = []
    tokens: list[int] = []
    lengths: list[int] = []
    totals: dict[str, Any] = {
        "n_generated": 0,
        "rounds": 0,
        "drafted": 0,
        "accepted": 0,
        "seconds": 0.0,
        "prompt_tokens": 0,
        "checkpoints": 0,
        "checkpoint_bytes": 0,
        "restore_seconds": 0.0,
        "marks_bytes": 0,
        "peak_rss_bytes": 0,
        "cpu_seconds": 0.0,
        "n_threads": 0,
    }
    memory: dict[str, Any] = {}
    finish = None
    # a logged conversation (request log) is one request, its earlier answers as logged
    n_requests = 1 if p.messages else len(p.turns)
    for i in range(n_requests):
        if p.messages:
            text = logged_conversation_text(cfg.prompt_format, p.messages)
        else:
            text = conversation_text(cfg.prompt_format, p.turns[: i + 1], answers, p.completion)
        ids = prompt_tokens(session.model, cfg.prompt_format, text, p.completion)
        session.start(
            ids,
            cfg.max_tokens,
            setting.strategy,
            temperature=setting.temperature,
            seed=task.seed,
            grammar=p.grammar if p.grammar is not None else cfg.grammar,
            **setting.knob_dict,
        )
        rounds = session.run()
        t = session.telemetry_dict()
        out = list(session.tokens)
        answers.append(session.text)
        tokens += out
        lengths.append(len(out))
        totals["n_generated"] += int(t["n_generated"])
        totals["rounds"] += int(t.get("rounds", len(rounds)))
        totals["drafted"] += int(t["drafted"])
        totals["accepted"] += int(t["accepted"])
        totals["seconds"] += float(t["seconds"])
        totals["cpu_seconds"] += float(t.get("cpu_seconds") or 0.0)
        totals["n_threads"] = int(t.get("n_threads") or 0)
        totals["prompt_tokens"] += len(ids)
        totals["checkpoints"] += int(t["checkpoints"]) + int(t["draft_checkpoints"])
        totals["checkpoint_bytes"] += int(t["checkpoint_bytes"]) + int(t["draft_checkpoint_bytes"])
        totals["restore_seconds"] += float(t["restore_seconds"]) + float(t["draft_restore_seconds"])
        memory = t["memory"]
        held = memory["target"]["marks_bytes"] + (memory["draft"]["marks_bytes"] if memory["draft"] else 0)
        totals["marks_bytes"] = max(totals["marks_bytes"], held)
        totals["peak_rss_bytes"] = max(totals["peak_rss_bytes"], int(memory["peak_rss_bytes"]))
        finish = getattr(session, "finished", None)
    totals.update(tokens=tokens, turn_lengths=lengths, finish=str(finish) if finish is not None else "")
    totals.update(memory_columns(memory))
    # the run's share pooled over its turns (summed CPU over summed wall seconds x threads): one round's is noisy
    share = cpu_share(totals["cpu_seconds"], totals["seconds"], totals["n_threads"])
    totals["cpu_share"] = float("nan") if share is None else share
    return totals


def memory_columns(memory: dict[str, Any]) -> dict[str, Any]:
    """A row's memory columns from a telemetry ``memory`` section: the target's kind and cache bytes by
    part, its weights, and the draft model's weights and caches together (0 without one)."""
    tgt, d = memory["target"], memory["draft"]
    return {
        "memory_kind": tgt["kind"],
        "kv_bytes": int(tgt["kv_bytes"]),
        "swa_kv_bytes": int(tgt["swa_kv_bytes"]),
        "recurrent_bytes": int(tgt["recurrent_bytes"]),
        "weight_bytes": int(tgt["weight_bytes"]),
        "draft_memory_bytes": int(d["weight_bytes"] + d["kv_bytes"] + d["swa_kv_bytes"] + d["recurrent_bytes"])
        if d
        else 0,
    }


def run_task(task: Task) -> TaskResult:
    """Run one task on this worker and return its rows (see :mod:`specviz.sweep.results` for the columns)."""
    import json

    t0 = time.perf_counter()
    session = worker_session(task.config)
    cfg = task.config
    rows: list[dict[str, Any]] = []
    none_tps = None
    for setting in task.settings:
        r = _generate(session, task, setting)
        tps = r["n_generated"] / r["seconds"] if r["seconds"] > 0 else 0.0
        if setting.is_baseline:
            none_tps = tps
        if setting.key not in task.keep:
            continue
        rows.append(
            {
                "question_id": task.prompt.id,
                "category": task.prompt.category,
                "repeat": task.repeat,
                "setting": setting.label,
                "setting_key": setting.key,
                "strategy": setting.strategy,
                "knobs": json.dumps(setting.knob_dict, sort_keys=True),
                "temperature": float(setting.temperature),
                "seed": int(task.seed),
                "turns": len(task.prompt.turns),
                "prompt_format": "plain" if task.prompt.completion else cfg.prompt_format.kind,
                "prompt_tokens": r["prompt_tokens"],
                "n_generated": r["n_generated"],
                "rounds": r["rounds"],
                "drafted": r["drafted"],
                "accepted": r["accepted"],
                "seconds": r["seconds"],
                "tokens_per_second": tps,
                "acceptance_rate": r["accepted"] / r["drafted"] if r["drafted"] else 0.0,
                "mean_accepted_tokens": r["n_generated"] / r["rounds"] if r["rounds"] else 0.0,
                "none_tokens_per_second": none_tps if none_tps is not None else float("nan"),
                "speedup": tps / none_tps if none_tps else float("nan"),
                "finish": r["finish"],
                "cpu_share": r["cpu_share"],
                "n_threads": r["n_threads"],
                **{
                    k: r[k]
                    for k in (
                        "memory_kind",
                        "kv_bytes",
                        "swa_kv_bytes",
                        "recurrent_bytes",
                        "weight_bytes",
                        "draft_memory_bytes",
                        "checkpoints",
                        "checkpoint_bytes",
                        "restore_seconds",
                        "marks_bytes",
                        "peak_rss_bytes",
                    )
                },
                "tokens": r["tokens"],
                "turn_lengths": r["turn_lengths"],
                "model": os.path.basename(cfg.model),
                "max_tokens": cfg.max_tokens,
                "grid_seed": cfg.grid_seed,
                "context": cfg.context_label,
                "grammar": grammar_label(task.prompt.grammar if task.prompt.grammar is not None else cfg.grammar),
                "sweep_grammar": grammar_label(cfg.grammar),
                "worker": worker_id(),
                "finished_at": time.time(),
            }
        )
    return TaskResult(task.id, rows, worker_id(), model_loads(), time.perf_counter() - t0)
