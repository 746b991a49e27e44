"""Running a sweep: plan the tasks, hand them to an executor, store rows as tasks finish.

Executors (all run :func:`specviz.sweep.worker.run_task`; each worker process loads the model once):

* :class:`LocalExecutor` (the default): a pool of worker processes on this machine, one per core,
  at most one task queued per worker (so "running" is exact and a lost worker costs one task). A worker
  that dies breaks Python's process pool; the pool is then rebuilt and the tasks that were running are
  run again (up to :data:`MAX_ATTEMPTS` times each).
* :class:`~specviz.sweep.dask_executor.DaskExecutor`: a Dask cluster (``distributed``), either a
  ``LocalCluster`` it starts or an existing scheduler; Dask itself re-runs a killed worker's tasks.

Whatever the executor, rows reach :class:`~specviz.sweep.results.ResultStore` once per identity, so a
task delivered twice, or re-run after its worker died, adds nothing twice.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .chat import probe_format
from .dataset import Dataset
from .grid import Grid
from .progress import SweepProgress
from .results import ResultStore
from .worker import (
    DEFAULT_CONTEXT,
    RunConfig,
    Task,
    TaskResult,
    context_label,
    grammar_label,
    local_initializer,
    run_task,
)

#: How often a task may be in flight when its local worker process dies before it counts as failed.
MAX_ATTEMPTS = 3


class Executor(Protocol):
    """Runs tasks and reports each outcome through the callbacks, in the calling thread."""

    #: Worker processes (or Dask worker threads) that run tasks at once.
    n_workers: int

    def describe(self) -> str:
        """One line naming the executor and its size."""

    def threads_per_task(self) -> int | None:
        """llama.cpp threads each task should use, or None to let each worker decide."""

    def execute(
        self,
        tasks: list[Task],
        config: RunConfig,
        *,
        done: Callable[[Task, TaskResult], None],
        failed: Callable[[Task, str], None],
        tick: Callable[[int], None],
    ) -> None:
        """Run every task; ``tick(running_rows)`` is called often, from the calling thread."""

    def close(self) -> None:
        """Release what the executor started."""


def usable_cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class LocalExecutor:
    """Worker processes on this machine (``workers``, default one per core), each loading the model once."""

    def __init__(self, workers: int | None = None) -> None:
        self.n_workers = max(1, workers or usable_cores())
        self.restarts = 0  # pools rebuilt after a worker process died

    def describe(self) -> str:
        """See :class:`Executor`."""
        return f"local, {self.n_workers} worker process{'es' if self.n_workers > 1 else ''}"

    def threads_per_task(self) -> int | None:
        """The cores shared out among the worker processes."""
        return max(1, usable_cores() // self.n_workers)

    def _pool(self, config: RunConfig):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn, not fork: the parent may hold llama.cpp threads and state a fork would copy half-made
        return ProcessPoolExecutor(
            max_workers=self.n_workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=local_initializer,
            initargs=(config,),
        )

    @staticmethod
    def _stop(pool) -> None:
        # Python < 3.14 has no public way to end a pool's processes at once; without this an interrupted
        # sweep would wait for every running task to finish.
        for proc in list(getattr(pool, "_processes", {}).values()):
            if proc.is_alive():
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)

    def execute(self, tasks: list[Task], config: RunConfig, *, done, failed, tick) -> None:
        """See :class:`Executor`."""
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        queue = deque(tasks)
        attempts: dict[str, int] = {}
        inflight: dict[Any, Task] = {}
        pool = self._pool(config)
        try:
            while queue or inflight:
                while queue and len(inflight) < self.n_workers:
                    t = queue.popleft()
                    inflight[pool.submit(run_task, t)] = t
                tick(sum(t.n_rows for t in inflight.values()))
                finished, _ = wait(list(inflight), timeout=0.5, return_when=FIRST_COMPLETED)
                broken = False
                for f in finished:
                    t = inflight.pop(f)
                    try:
                        res = f.result()
                    except BrokenProcessPool:
                        broken = True
                        self._retry(t, attempts, queue, failed)
                    except Exception as e:  # noqa: BLE001 - whatever the task raised is reported as its failure, not retried
                        failed(t, f"{type(e).__name__}: {e}")
                    else:
                        done(t, res)
                if broken:  # every task still in flight went down with the pool: run them again
                    for t in inflight.values():
                        self._retry(t, attempts, queue, failed)
                    inflight.clear()
                    self._stop(pool)
                    pool = self._pool(config)
                    self.restarts += 1
        finally:
            self._stop(pool)

    @staticmethod
    def _retry(t: Task, attempts: dict[str, int], queue: deque, failed) -> None:
        attempts[t.id] = attempts.get(t.id, 0) + 1
        if attempts[t.id] >= MAX_ATTEMPTS:
            failed(t, f"its worker process died {attempts[t.id]} times while running it")
        else:
            queue.appendleft(t)

    def close(self) -> None:
        """Nothing outlives :meth:`execute`."""


@dataclass
class SweepSummary:
    """What a sweep did: rows stored before and now, failures, time, and the model loads per worker."""

    output: str
    executor: str
    prompt_format: str
    total_rows: int
    resumed_rows: int = 0
    new_rows: int = 0
    tasks: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    wall_seconds: float = 0.0
    model_loads: dict[str, int] = field(default_factory=dict)  # worker -> target models it had loaded

    @property
    def complete(self) -> bool:
        """True when every row of the grid is stored."""
        return self.resumed_rows + self.new_rows >= self.total_rows


def derive_seed(grid_seed: int, question_id: str, repeat: int) -> int:
    """The sampling seed of one (prompt, repeat): the same for every setting and on every worker."""
    h = hashlib.sha256(f"{grid_seed}\0{question_id}\0{repeat}".encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def plan_tasks(
    dataset: Dataset, grid: Grid, config: RunConfig, done: Callable[[tuple[str, str, int]], bool] = lambda k: False
) -> list[Task]:
    """The tasks still to run: per (repeat, prompt, temperature), ``none`` then the settings not yet done.

    Repeats are the outer loop, so a sweep stopped early has covered every prompt before repeating any.
    """
    tasks = []
    for repeat in range(grid.repeats):
        for p in dataset.prompts:
            for temp in grid.temperatures():
                settings = grid.at(temp)
                keep = tuple(s.key for s in settings if not done((p.id, s.key, repeat)))
                if not keep:
                    continue
                run = tuple(s for s in settings if s.is_baseline or s.key in keep)
                tid = f"{p.id}|r{repeat}|T{temp:g}"
                tasks.append(Task(tid, p, repeat, temp, derive_seed(grid.seed, p.id, repeat), run, keep, config))
    return tasks


def run_sweep(
    dataset: Dataset,
    grid: Grid,
    output: str | os.PathLike,
    *,
    model: str | os.PathLike | None = None,
    executor: Executor | None = None,
    n_ctx: int = 4096,
    prompt_format: str = "auto",
    threads: int | None = None,
    progress: bool = True,
    on_result: Callable[[TaskResult], None] | None = None,
    context: dict[str, Any] | None = None,
    grammar: str | None = None,
) -> SweepSummary:
    """Run (or resume) a sweep of ``dataset`` over ``grid`` into the Parquet file ``output``.

    ``context``: the deployment's context settings for every task (``flash_attn``, ``cache_type_k`` /
    ``cache_type_v``, ``n_batch``, ``n_ubatch``; :class:`~specviz.backends.context_settings.ContextSettings`)
    and the model's placement (``n_gpu_layers``: each worker loads the model with that many layers on a GPU
    build's GPU); rows record them (the ``context`` column) and a file made with others is not resumed.
    ``grammar``: a checked GBNF grammar every prompt's output obeys (a prompt from a request log that gives
    its own keeps it); rows record the grammar used (the ``grammar`` column,
    :func:`~specviz.sweep.worker.grammar_label`) and a file made with another sweep-wide grammar is not resumed.

    ``model`` defaults to the embedded model; ``executor`` to a :class:`LocalExecutor` with one worker
    per core. Rows already in ``output`` are skipped. ``on_result`` is called with each finished task's
    result after its rows are stored. A KeyboardInterrupt stops the workers and keeps every stored row.
    """
    from ..models.embedded import resolve_model

    t0 = time.perf_counter()
    model_path = str(resolve_model(model).resolve())
    ctx_pairs = tuple(sorted((context or {}).items()))
    store = ResultStore(
        output,
        {
            "model": os.path.basename(model_path),
            "max_tokens": grid.max_tokens,
            "grid_seed": grid.seed,
            "context": context_label(dict(ctx_pairs)),
            "sweep_grammar": grammar_label(grammar),
        },
        missing={"context": DEFAULT_CONTEXT, "sweep_grammar": ""},
    )
    bar = None
    try:
        fmt = probe_format(model_path, prompt_format)
        executor = executor or LocalExecutor()
        config = RunConfig(
            model_path,
            grid.max_tokens,
            fmt,
            n_ctx=n_ctx,
            n_threads=threads or executor.threads_per_task(),
            grid_seed=grid.seed,
            context=ctx_pairs,
            grammar=grammar,
        )
        total = len(dataset.prompts) * len(grid.settings) * grid.repeats
        grid_keys = {(p.id, s.key, r) for p in dataset.prompts for s in grid.settings for r in range(grid.repeats)}
        resumed = len(grid_keys & store.keys)
        tasks = plan_tasks(dataset, grid, config, store.done)
        summary = SweepSummary(str(output), executor.describe(), fmt.describe(), total, resumed, tasks=len(tasks))
        bar = SweepProgress(total, initial=resumed, enabled=progress)

        def done(task: Task, res: TaskResult) -> None:
            new = store.add(res.rows)
            summary.new_rows += new
            summary.model_loads[res.worker] = max(res.model_loads, summary.model_loads.get(res.worker, 0))
            bar.update(done=new)
            if on_result is not None:
                on_result(res)

        def failed(task: Task, why: str) -> None:
            summary.failures.append((task.id, why))
            bar.update(failed=task.n_rows)

        if tasks:
            executor.execute(tasks, config, done=done, failed=failed, tick=lambda n: bar.update(running=n))
    finally:
        store.close()
        if bar is not None:
            bar.close()
    summary.wall_seconds = time.perf_counter() - t0
    return summary
