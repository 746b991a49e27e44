"""``specviz sweep`` and ``specviz report``: the command-line side of :mod:`specviz.sweep`.

Every option is checked before any model loads, as in the rest of the CLI: a bad one exits with
status 2 and one line naming the option, the value and what is allowed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..decoding.knob_schema import ranged_int
from ..errors import KnobError
from ..sweep.chat import PROMPT_FORMATS
from ..sweep.dataset import DatasetError, check_dataset_spec, load_dataset
from ..sweep.grid import GridError, GridSpec, build_grid, parse_knob_flag, read_grid_file
from .grammar_options import add_grammar_options, grammar_request
from .options import UsageError, int_option, warn
from .settings_options import add_settings_options, check_settings_for, gpu_layers_of, settings_of


def add_commands(sub: Any) -> None:
    """Add ``sweep`` and ``report`` to the ``specviz`` subcommands."""
    sw = sub.add_parser("sweep", help="run many prompts under many settings into a Parquet file")
    sw.add_argument(
        "dataset",
        metavar="DATASET",
        help="a .jsonl file (MT-bench / Spec-Bench questions), a .txt file (one prompt per line), "
        "a workload kind, or 'workloads' for every kind",
    )
    sw.add_argument(
        "-o", "--output", required=True, metavar="RESULTS.parquet", help="results file (resumed if it exists)"
    )
    sw.add_argument(
        "--strategy",
        action="append",
        default=[],
        metavar="S",
        help="a strategy to sweep (repeatable or comma-separated; none is always included; "
        "default: every draftless strategy)",
    )
    sw.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="[STRATEGY:]NAME=V1,V2",
        help="values of a knob (repeatable); every strategy having it gets each value",
    )
    sw.add_argument(
        "--temperature",
        action="append",
        default=[],
        metavar="T",
        help="a sampling temperature (repeatable; default 0: greedy)",
    )
    sw.add_argument(
        "--draft-model",
        action="append",
        default=[],
        metavar="PATH",
        help="a draft GGUF for the draft strategy (repeatable; each is a setting)",
    )
    sw.add_argument("--grid", metavar="FILE", help="a .toml or .yaml grid file; flags override its keys")
    add_grammar_options(sw)
    sw.add_argument("--max-tokens", default=None, help="tokens to generate per turn (default 128)")
    sw.add_argument("--repeats", default=None, help="runs of each (prompt, setting) (default 1)")
    sw.add_argument("--seed", default=None, help="base of the per-prompt sampling seeds (default 0)")
    sw.add_argument("--model", help="target GGUF path (default: the embedded Gemma 3 270M)")
    sw.add_argument(
        "--n-ctx", "-c", "--ctx-size", dest="n_ctx", default="4096", help="context length per worker (default 4096)"
    )
    sw.add_argument(
        "--prompt-format", default="auto", help="auto (the model's chat template when it has one), chat or plain"
    )
    where = sw.add_mutually_exclusive_group()
    where.add_argument("--workers", default=None, help="local worker processes (default: one per core)")
    where.add_argument("--cluster", default=None, metavar="local:N", help="a Dask LocalCluster of N workers")
    where.add_argument("--scheduler", default=None, metavar="ADDRESS", help="an existing Dask scheduler")
    sw.add_argument("--threads", default=None, help="llama.cpp threads per task (default: cores / workers)")
    sw.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="run the dataset's well-formed lines and report the malformed ones (default: refuse)",
    )
    sw.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_settings_options(sw, threads=False, gpu_layers=True)  # threads: --threads, per task
    sw.set_defaults(func=cmd_sweep)

    rp = sub.add_parser("report", help="tables and an offline HTML page from a sweep's results")
    rp.add_argument("results", metavar="RESULTS.parquet")
    rp.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="REPORT.html",
        help="the HTML page to write (default: RESULTS.html beside the results)",
    )
    rp.add_argument("--title", default=None, help="the page's title")
    rp.set_defaults(func=cmd_report)


def _need(module: str, extra: str, option: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UsageError(f"option {option}: needs the Python package {module!r}; pip install 'specviz[{extra}]'")


def _grid_spec(args: argparse.Namespace) -> GridSpec:
    spec = read_grid_file(args.grid) if args.grid else GridSpec()
    if args.strategy:
        spec.strategies, spec.origin["strategies"] = list(args.strategy), "--strategy"
    if args.temperature:
        spec.temperatures, spec.origin["temperatures"] = list(args.temperature), "--temperature"
    if args.draft_model:
        spec.draft_models, spec.origin["draft_models"] = list(args.draft_model), "--draft-model"
    if args.knob:
        knobs = dict(spec.knobs)
        for text in args.knob:
            strategy, name, values = parse_knob_flag(text)
            if strategy is None:
                knobs[name] = values
            else:
                table = dict(knobs.get(strategy) or {})
                table[name] = values
                knobs[strategy] = table
        spec.knobs, spec.origin["knobs"] = knobs, "--knob"
    for name in ("max_tokens", "repeats", "seed"):
        v = getattr(args, name)
        if v is not None:
            setattr(spec, name, v)
            spec.origin[name] = "--" + name.replace("_", "-")
    return spec


def _validate_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Every option of ``specviz sweep``, checked and converted, without loading a model."""
    for module in ("pandas", "pyarrow", "tqdm"):
        _need(module, "sweep", "-o")
    why = check_dataset_spec(args.dataset)
    if why:
        raise UsageError(f"argument DATASET: {args.dataset!r} is not allowed; {why}")
    out = Path(args.output)
    if not out.parent.is_dir():
        raise UsageError(f"option -o: folder {str(out.parent)!r} does not exist")
    if out.suffix.lower() != ".parquet":
        raise UsageError(f"option -o: {args.output!r} is not allowed; expected a .parquet file name")
    try:
        grid = build_grid(_grid_spec(args))
    except GridError as e:
        raise UsageError(str(e)) from None
    if args.prompt_format not in PROMPT_FORMATS:
        raise UsageError(
            f"option --prompt-format: {args.prompt_format!r} is not allowed; choose one of: {', '.join(PROMPT_FORMATS)}"
        )
    n_ctx = int_option("--n-ctx", args.n_ctx, 16, 1 << 20)
    threads, workers, cluster = _where_to_run(args)
    if args.model is not None and not Path(args.model).is_file():
        raise UsageError(f"option --model: {args.model!r} does not exist; pass the path of a .gguf file")
    settings = settings_of(args, n_ctx=n_ctx)
    check_settings_for(settings, args.model)
    context = {k: getattr(settings, k) for k in ("flash_attn", "cache_type_k", "cache_type_v", "n_batch", "n_ubatch")}
    n_gpu_layers = gpu_layers_of(args, warn=warn)
    if n_gpu_layers:  # recorded only where set: the context column of CPU sweeps stays as it was
        context["n_gpu_layers"] = n_gpu_layers
    try:
        dataset = load_dataset(args.dataset, skip_bad_lines=args.skip_bad_lines)
    except DatasetError as e:
        for problem in e.problems[1:]:
            print(f"specviz: refused: {problem}", file=sys.stderr)
        raise UsageError(str(e)) from None
    for problem in dataset.refused:
        warn(f"refused {problem}")
    grammar = grammar_request(args, None).get("grammar")  # checked before any model loads
    return {
        "grammar": grammar,
        "dataset": dataset,
        "grid": grid,
        "n_ctx": n_ctx,
        "context": context,
        "threads": threads,
        "workers": workers,
        "cluster": cluster,
    }


def _where_to_run(args: argparse.Namespace) -> tuple[int | None, int | None, int | None]:
    """``--threads``, ``--workers`` and ``--cluster local:N`` as numbers (None: not given); ``--scheduler``
    checked for its form. The Dask options need the ``cluster`` extra."""
    threads = None if args.threads is None else int_option("--threads", args.threads, 1, 1024)
    workers = None if args.workers is None else int_option("--workers", args.workers, 1, 1024)
    cluster = None
    if args.cluster is not None:
        kind, _, n = args.cluster.partition(":")
        try:
            cluster = ranged_int(n, 1, 1024) if kind == "local" else None
        except KnobError:
            cluster = None
        if cluster is None:
            raise UsageError(
                f"option --cluster: {args.cluster!r} is not allowed; expected local:N with N in "
                "[1, 1024] (or --scheduler ADDRESS for an existing Dask cluster)"
            )
        _need("distributed", "cluster", "--cluster")
    if args.scheduler is not None:
        if not args.scheduler.strip() or " " in args.scheduler:
            raise UsageError(
                f"option --scheduler: {args.scheduler!r} is not allowed; expected a Dask scheduler "
                "address such as tcp://10.0.0.5:8786"
            )
        _need("distributed", "cluster", "--scheduler")
    return threads, workers, cluster


def cmd_sweep(args: argparse.Namespace) -> int:
    """``specviz sweep``: run (or resume) a sweep and print its table."""
    cfg = _validate_sweep(args)
    from ..sweep.execution import LocalExecutor, run_sweep
    from ..sweep.report import format_table, summarise
    from ..sweep.results import read_results

    dataset, grid = cfg["dataset"], cfg["grid"]
    if cfg["cluster"] is not None or args.scheduler is not None:
        from ..sweep.dask_executor import DaskExecutor

        executor: Any = DaskExecutor(scheduler=args.scheduler, local_workers=cfg["cluster"])
    else:
        executor = LocalExecutor(cfg["workers"])
    print(
        f"specviz sweep: {len(dataset)} prompts x {len(grid.settings)} settings x {grid.repeats} repeat(s), "
        f"{grid.max_tokens} tokens per turn, on {executor.describe()}",
        file=sys.stderr,
    )
    try:
        summary = run_sweep(
            dataset,
            grid,
            args.output,
            model=args.model,
            executor=executor,
            n_ctx=cfg["n_ctx"],
            context=cfg["context"],
            grammar=cfg["grammar"],
            prompt_format=args.prompt_format,
            threads=cfg["threads"],
            progress=not args.no_progress,
        )
    except KeyboardInterrupt:
        print(
            f"specviz sweep: interrupted; the finished runs are kept in {args.output}: run the same command "
            "again to resume",
            file=sys.stderr,
        )
        return 130
    finally:
        executor.close()
    for task, why in summary.failures:
        print(f"specviz sweep: failed {task}: {why}", file=sys.stderr)
    print(
        f"specviz sweep: {summary.resumed_rows + summary.new_rows} of {summary.total_rows} runs stored "
        f"({summary.resumed_rows} from before, {summary.new_rows} new) in {summary.wall_seconds:.1f} s; "
        f"prompts: {summary.prompt_format}; results: {args.output}",
        file=sys.stderr,
    )
    if summary.resumed_rows + summary.new_rows:
        print(format_table(summarise(read_results(args.output))))
    return 1 if summary.failures else 0


def cmd_report(args: argparse.Namespace) -> int:
    """``specviz report``: print the table and write the HTML page."""
    for module, extra in (("pandas", "sweep"), ("pyarrow", "sweep"), ("plotly", "sweep")):
        _need(module, extra, "RESULTS")
    src = Path(args.results)
    from ..sweep.results import journal_path

    if not src.is_file() and not journal_path(src).is_file():
        raise UsageError(
            f"argument RESULTS: {args.results!r} does not exist; pass a results file written by specviz sweep"
        )
    out = Path(args.output) if args.output else src.with_suffix(".html")
    if not out.parent.is_dir():
        raise UsageError(f"option -o: folder {str(out.parent)!r} does not exist")
    if out.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"option -o: {str(out)!r} is not allowed; expected an .html file name")
    from ..sweep.report import format_table, summarise, write_report
    from ..sweep.results import read_results

    df = read_results(src)
    if df.empty:
        raise UsageError(f"argument RESULTS: {args.results!r} holds no runs yet")
    print(format_table(summarise(df)))
    write_report(df, out, title=args.title or f"specviz sweep: {src.name}")
    print(f"specviz report: wrote {out}", file=sys.stderr)
    return 0
