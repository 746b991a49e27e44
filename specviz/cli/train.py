"""``specviz train-eagle3``: the command-line side of :mod:`specviz.train`.

Every option is checked before any model loads or torch is imported, as in the rest of the CLI: a bad one
exits with status 2 and one line naming the option, the value and what is allowed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .options import UsageError, int_option

DTYPES = ("auto", "f32", "f16", "q8_0")
EVALS = ("full", "quick", "none")


def add_commands(sub: Any) -> None:
    """Add ``train-eagle3`` to the ``specviz`` subcommands."""
    t = sub.add_parser("train-eagle3", help="train an EAGLE-3 draft head for a target on this machine (CPU, torch)")
    t.add_argument(
        "target", metavar="TARGET", nargs="?", default=None, help="the target GGUF (default: the embedded Gemma 3 270M)"
    )
    t.add_argument("-o", "--output", required=True, metavar="HEAD.gguf", help="the head to write")
    t.add_argument(
        "--prompts",
        metavar="FILE.jsonl",
        help='more training prompts: one JSON object per line with "prompt", "text" or "turns"',
    )
    t.add_argument("--minutes", default="40", help="the whole run's time budget (default 40)")
    t.add_argument("--draft-vocab", default="8192", help="size of the reduced draft vocabulary (default 8192)")
    t.add_argument("--resume", action="store_true", help="continue the run kept in the work folder")
    t.add_argument(
        "--work-dir",
        metavar="DIR",
        help="where the corpus and checkpoints live (default: ~/.cache/specviz/train/<output name>-<hash>)",
    )
    t.add_argument("--threads", default=None, help="CPU threads for llama.cpp and torch (default: all cores)")
    t.add_argument("--evaluate", default="full", help="the report at the end: full, quick or none (default full)")
    t.add_argument("--eval-repeats", default="1", help="repeats of each evaluation prompt (default 1)")
    t.add_argument("--seed", default="0", help="seed of the corpus order, sampling and initialisation")
    t.add_argument("--corpus-tokens", default=None, help="generate at most this many corpus tokens")
    t.add_argument("--train-steps", default=None, help="stop training after this many optimizer steps")
    t.add_argument("--max-new", default="160", help="tokens the target generates per prompt (default 160)")
    t.add_argument(
        "--dtype",
        default="auto",
        help="storage of the head's matrices: auto (the fastest measured of f16 and q8_0), f32, f16 or q8_0",
    )
    t.add_argument("--depth", default="3", help="drafting steps unrolled in training (default 3)")
    t.add_argument("--ffn", default="1536", help="the head's feed-forward width (default 1536)")
    t.add_argument("--no-builtin-corpus", action="store_true", help="train on --prompts only")
    t.add_argument("--checkpoint-minutes", default="3", help="minutes between checkpoints (default 3)")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    t.set_defaults(func=cmd_train_eagle3)


def _number(flag: str, value: str, lo: float, hi: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not lo <= v <= hi:
        raise UsageError(f"option {flag}: {value!r} is not allowed; expected a number in [{lo:g}, {hi:g}]")
    return v


def options_from_args(args: argparse.Namespace) -> Any:
    """Validate the options into :class:`~specviz.train.run.TrainOptions` (no model loaded, no torch imported)."""
    from ..train.corpus import PromptFileError, read_prompts_jsonl
    from ..train.run import TrainOptions

    out = Path(args.output)
    if out.is_dir():
        raise UsageError(f"option -o: {args.output!r} is a folder; pass the path of the .gguf file to write")
    if not out.parent.is_dir():
        raise UsageError(f"option -o: folder {str(out.parent)!r} does not exist")
    if args.target is not None and not Path(args.target).is_file():
        raise UsageError(f"argument TARGET: {args.target!r} does not exist; pass the target .gguf file")
    if args.prompts is not None:
        if not Path(args.prompts).is_file():
            raise UsageError(f"option --prompts: {args.prompts!r} is not a readable file")
        try:
            read_prompts_jsonl(args.prompts)
        except PromptFileError as e:
            raise UsageError(f"option --prompts: {e}") from None
    elif args.no_builtin_corpus:
        raise UsageError("option --no-builtin-corpus needs --prompts FILE.jsonl: there would be nothing to train on")
    if args.evaluate not in EVALS:
        raise UsageError(f"option --evaluate: {args.evaluate!r} is not allowed; choose one of: {', '.join(EVALS)}")
    if args.dtype not in DTYPES:
        raise UsageError(f"option --dtype: {args.dtype!r} is not allowed; choose one of: {', '.join(DTYPES)}")
    if args.work_dir is not None and Path(args.work_dir).exists() and not Path(args.work_dir).is_dir():
        raise UsageError(f"option --work-dir: {args.work_dir!r} is a file; pass a folder")
    minutes = _number("--minutes", args.minutes, 0.05, 24 * 60)
    opts = TrainOptions(
        output=out,
        target=Path(args.target) if args.target else None,
        prompts=Path(args.prompts) if args.prompts else None,
        minutes=minutes,
        draft_vocab=int_option("--draft-vocab", args.draft_vocab, 2, 1 << 20),
        resume=args.resume,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        threads=int_option("--threads", args.threads, 1, 512) if args.threads is not None else None,
        evaluate=args.evaluate,
        eval_repeats=int_option("--eval-repeats", args.eval_repeats, 1, 100),
        seed=int_option("--seed", args.seed, 0, 2**31 - 1),
        corpus_tokens=int_option("--corpus-tokens", args.corpus_tokens, 1) if args.corpus_tokens else None,
        train_steps=int_option("--train-steps", args.train_steps, 1) if args.train_steps else None,
        max_new=int_option("--max-new", args.max_new, 1, 4096),
        dtype=args.dtype,
        builtin_corpus=not args.no_builtin_corpus,
        checkpoint_minutes=_number("--checkpoint-minutes", args.checkpoint_minutes, 0.0, 24 * 60),
        progress=not args.no_progress,
        train={"steps": int_option("--depth", args.depth, 1, 16), "n_ff": int_option("--ffn", args.ffn, 8, 1 << 16)},
    )
    return opts


def cmd_train_eagle3(args: argparse.Namespace) -> int:
    """``specviz train-eagle3``: train a head, write it, print the evaluation."""
    opts = options_from_args(args)
    try:
        import torch  # noqa: F401
    except ImportError:
        from ..errors import SpecvizError

        raise SpecvizError(
            "training needs torch: pip install 'specviz[train]' (on a machine without a GPU, install "
            "the CPU-only wheel first: pip install torch --index-url "
            "https://download.pytorch.org/whl/cpu)"
        ) from None
    from ..train.run import train_eagle3

    res = train_eagle3(opts)
    print(f"head: {res.output}")
    print(res.coverage)
    v = res.validation
    print(
        f"validation accuracy by depth: {' '.join(f'{a:.3f}' for a in v['acc_greedy'])} (greedy sequences), "
        f"tokens per 3-token draft round ≈ {v['tau_greedy']:.2f}"
    )
    print(res.export)
    if res.evaluation:
        print()
        print(res.evaluation)
    secs = ", ".join(f"{k} {v / 60:.1f} min" for k, v in res.seconds.items())
    print(f"\ntime: {secs}", file=sys.stderr)
    return 0
