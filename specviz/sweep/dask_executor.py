"""Sweeps on Dask (``distributed``, the optional extra ``specviz[cluster]``).

:class:`DaskExecutor` submits every task to a Dask cluster: a ``LocalCluster`` of N single-threaded
worker processes it starts itself (``--cluster local:N``), or an existing scheduler
(``--scheduler ADDRESS``), or a :class:`distributed.Client` the caller already holds.

The model is loaded once per worker process, never per task: :class:`ModelPreload`, a worker plugin,
loads it when a worker starts (workers that join or restart later included) into the per-process
cache that :func:`~specviz.sweep.worker.run_task` reads. When a worker dies, the scheduler runs its
tasks again on another worker (Dask's own rescheduling); a task that has killed several workers fails
with ``KilledWorker``.

Remote workers need specviz installed and the model at the same path (or the embedded model).
"""

from __future__ import annotations

import logging
import time
import uuid
import zlib
from typing import Any

from ..errors import SpecvizError
from .worker import RunConfig, Task, run_task, warm_up

try:
    from distributed.diagnostics.plugin import WorkerPlugin
except ImportError:  # pragma: no cover - the extra is missing; DaskExecutor says so when asked for
    WorkerPlugin = object  # type: ignore[misc,assignment]


class ClusterError(SpecvizError):
    """Dask is not installed, or the cluster cannot be reached or started."""


class ModelPreload(WorkerPlugin):
    """Loads the sweep's model into each worker process when the worker starts (or joins later)."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    def setup(self, worker: Any) -> None:
        """Called by Dask on every worker, including those started after registration."""
        warm_up(self.config)


class DaskExecutor:
    """Runs sweep tasks on Dask: ``client``, or a new ``Client(scheduler)``, or a ``LocalCluster(local_workers)``."""

    def __init__(
        self,
        client: Any = None,
        *,
        scheduler: str | None = None,
        local_workers: int | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise ClusterError("Dask is not installed; pip install 'specviz[cluster]' (distributed)") from None
        self._owned: list[Any] = []
        self.local_workers = local_workers
        if client is not None:
            self.client = client
            self.where = f"Dask at {client.scheduler.address}"
        elif scheduler is not None:
            try:
                self.client = Client(scheduler, timeout=connect_timeout)
            except (OSError, TimeoutError) as e:
                raise ClusterError(
                    f"cannot reach the Dask scheduler at {scheduler} ({e}); check the address "
                    "and that the scheduler is running"
                ) from None
            self._owned.append(self.client)
            self.where = f"Dask at {scheduler}"
        else:
            n = local_workers or 1
            # one thread per worker process: a task holds the process's llama.cpp session for its whole run
            cluster = LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.ERROR
            )
            self.client = Client(cluster)
            self._owned += [self.client, cluster]
            self.where = f"Dask LocalCluster, {n} worker process{'es' if n > 1 else ''}"

    @property
    def n_workers(self) -> int:
        """Task slots (worker threads) in the cluster now."""
        info = self.client.scheduler_info()
        return sum(w.get("nthreads", 1) for w in info.get("workers", {}).values()) or 1

    def describe(self) -> str:
        """See :class:`~specviz.sweep.execution.Executor`."""
        return self.where

    def threads_per_task(self) -> int | None:
        """A local cluster shares this machine's cores out; remote workers decide for themselves."""
        if self.local_workers:
            from .execution import usable_cores

            return max(1, usable_cores() // self.local_workers)
        return None

    def execute(self, tasks: list[Task], config: RunConfig, *, done, failed, tick) -> None:
        """See :class:`~specviz.sweep.execution.Executor`."""
        from distributed import as_completed

        # one name per model: registering again replaces the plugin instead of piling them up
        plugin = f"specviz-sweep-model-{zlib.crc32(config.model.encode()):08x}"
        self.client.register_plugin(ModelPreload(config), name=plugin)
        run = uuid.uuid4().hex[:8]
        by_key: dict[str, Task] = {}
        futures = []
        for i, t in enumerate(tasks):
            key = f"specviz-sweep-{run}-{i}"
            by_key[key] = t
            futures.append(self.client.submit(run_task, t, key=key, pure=False))
        ac = as_completed(futures)
        last_tick = 0.0
        try:
            while not ac.is_empty():
                batch = ac.next_batch(block=False)
                for f in batch:
                    t = by_key[f.key]
                    if f.status == "finished":
                        done(t, f.result())
                    elif f.status == "cancelled":
                        failed(t, "cancelled by the Dask scheduler")
                    else:
                        exc = f.exception()
                        failed(t, f"{type(exc).__name__}: {exc}")
                    f.release()
                now = time.monotonic()
                if now - last_tick >= 0.5:
                    last_tick = now
                    tick(self._running_rows(by_key))
                if not batch:
                    time.sleep(0.1)
        finally:
            pending = [f for f in futures if not f.done()]
            if pending:
                self.client.cancel(pending)
            # workers that join later need no model for this sweep any more (those running keep theirs cached)
            self.client.unregister_worker_plugin(plugin)

    def _running_rows(self, by_key: dict[str, Task]) -> int:
        """Rows of the tasks running now: the scheduler also counts tasks queued on a worker as processing,
        so each worker counts for at most as many tasks as it has threads."""
        processing = self.client.processing()
        threads = {a: w.get("nthreads", 1) for a, w in self.client.scheduler_info().get("workers", {}).items()}
        rows = 0
        for addr, keys in processing.items():
            mine = [by_key[k] for k in keys if k in by_key]
            rows += sum(t.n_rows for t in mine[: threads.get(addr, 1)])
        return rows

    def close(self) -> None:
        """Close the client and the local cluster this executor started (a given client is left open)."""
        for obj in self._owned:
            try:
                obj.close()
            except (OSError, RuntimeError, TimeoutError) as e:  # workers already gone: say so, keep the results
                logging.getLogger(__name__).warning("closing %s: %s", type(obj).__name__, e)
        self._owned = []
