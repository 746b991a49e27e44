"""Sweeps: many prompts under many settings, on this machine or a Dask cluster, into one Parquet file.

The pieces, one module each:

* :mod:`~specviz.sweep.dataset`: the prompts (MT-bench / Spec-Bench JSONL, a text file, or the
  built-in workload kinds);
* :mod:`~specviz.sweep.chat`: turns into prompt tokens (the model's chat template, or plain text);
* :mod:`~specviz.sweep.grid`: the settings (strategies x knob values x temperatures x draft models);
* :mod:`~specviz.sweep.worker`: what a worker process runs (one prompt, every setting, ``none`` first);
* :mod:`~specviz.sweep.execution` and :mod:`~specviz.sweep.dask_executor`: local processes or Dask;
* :mod:`~specviz.sweep.results`: the Parquet file, written as tasks finish, and resuming;
* :mod:`~specviz.sweep.progress`: the progress bar (terminal and JupyterLab);
* :mod:`~specviz.sweep.report`: the per-category table, the charts and the offline HTML page.

From Python (in a script, under ``if __name__ == "__main__":``: the local workers are spawned)::

    from specviz.sweep import GridSpec, build_grid, format_table, load_dataset, read_results, run_sweep, summarise
    grid = build_grid(GridSpec(strategies=["prompt-lookup"], knobs={"draft_max": [4, 8]}, max_tokens=64))
    run_sweep(load_dataset("workloads"), grid, "results.parquet")
    print(format_table(summarise(read_results("results.parquet"))))
"""

from __future__ import annotations

from .chat import PromptFormat
from .dataset import Dataset, DatasetError, Prompt, load_dataset
from .execution import LocalExecutor, SweepSummary, plan_tasks, run_sweep
from .grid import Grid, GridError, GridSpec, Setting, build_grid, read_grid_file
from .results import ResultStore, ResumeError, read_results


def __getattr__(name: str):
    # the report needs pandas and plotly, and Dask is an optional extra: import them only when asked for
    if name in ("summarise", "leaderboard", "format_table", "figures", "write_report"):
        from . import report

        return getattr(report, name)
    if name == "DaskExecutor":
        from .dask_executor import DaskExecutor

        return DaskExecutor
    raise AttributeError(f"module 'specviz.sweep' has no attribute {name!r}")


__all__ = [
    "DaskExecutor",
    "Dataset",
    "DatasetError",
    "Grid",
    "GridError",
    "GridSpec",
    "LocalExecutor",
    "Prompt",
    "PromptFormat",
    "ResultStore",
    "ResumeError",
    "Setting",
    "SweepSummary",
    "build_grid",
    "figures",
    "format_table",
    "leaderboard",
    "load_dataset",
    "plan_tasks",
    "read_grid_file",
    "read_results",
    "run_sweep",
    "summarise",
    "write_report",
]
