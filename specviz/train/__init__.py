"""Training EAGLE-3 draft heads on this machine: ``specviz train-eagle3`` (needs the ``train`` extra: torch).

The pieces, one module each:

* :mod:`~specviz.train.corpus`: the prompts (specviz's own corpus, the workloads that are not held out, a
  user's JSONL) and the held-out evaluation prompts;
* :mod:`~specviz.train.generate`: the target's generations for them, many sequences per batch, with the
  features a head reads captured from the same GGUF and the target's top next tokens as labels;
* :mod:`~specviz.train.dataset`: the corpus as training data, the draft vocabulary and its coverage;
* :mod:`~specviz.train.model`: the head as a torch module whose forward pass is llama.cpp's ``eagle3`` graph;
* :mod:`~specviz.train.trainer`: the loss, the schedule, checkpoints and resuming;
* :mod:`~specviz.train.export`: the GGUF, in the storage type that drafts fastest here;
* :mod:`~specviz.train.evaluate`: the benchmark on held-out prompts;
* :mod:`~specviz.train.run`: all of it within a time budget (``train_eagle3``); ``commands``: the CLI.

From Python::

    from specviz.train import TrainOptions, train_eagle3
    result = train_eagle3(TrainOptions(output="head.gguf", minutes=40))
    print(result.evaluation)

Only :mod:`~specviz.train.corpus` works without torch; the rest imports it when used.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # torch is an optional extra: import the pipeline only when asked for
    if name in ("TrainOptions", "TrainResult", "train_eagle3"):
        from . import run

        return getattr(run, name)
    if name == "evaluate_head":
        from .evaluate import evaluate_head

        return evaluate_head
    raise AttributeError(f"module 'specviz.train' has no attribute {name!r}")


__all__ = ["TrainOptions", "TrainResult", "evaluate_head", "train_eagle3"]
