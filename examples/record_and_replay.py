"""Record a session to JSON Lines, then replay it: printed round by round, or in the inspector.

    python examples/record_and_replay.py [--model PATH] [--out session.jsonl] [--strategy prompt-lookup]
        [--max-tokens 64] [--serve [--port 5006]]

Recording subscribes a :class:`specviz.Recorder` to the session. Replaying needs no model: the events
carry the token texts. Without ``--serve`` the recording is printed (one line per round: the accepted
tokens, the target's own token and the rejected ones); with ``--serve`` it is shown in the Panel
inspector, exactly like ``specviz replay FILE.jsonl`` (in a notebook: ``Inspector.replay(path)``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


def record(
    model,
    prompt: str,
    out: Path,
    *,
    strategy: str = "prompt-lookup",
    max_tokens: int = 64,
    n_threads: int | None = None,
    **knobs,
) -> dict:
    """Generate ``prompt`` with every event written to ``out``; returns the final telemetry."""
    from specviz import Recorder, Session

    with Session(model, n_ctx=2048, n_threads=n_threads) as s, Recorder(out) as rec:
        unsubscribe = s.subscribe(rec)
        s.start(prompt, max_tokens=max_tokens, strategy=strategy, **knobs)
        s.run()
        unsubscribe()
        return s.telemetry_dict()


def show(piece: str) -> str:
    """A token text with whitespace visible (as the inspector shows it)."""
    return piece.replace(" ", "·").replace("\n", "↵").replace("\t", "→")


def replay_text(path: Path) -> str:
    """The recording as text, one line per round: ``[accepted] +target ~rejected~`` and a summary."""
    from specviz.decoding.recorder import iter_rounds, read_events

    events = read_events(path)
    lines = []
    start = next((e for e in events if e.kind == "session_started"), None)
    if start is not None:
        lines.append(
            f"model {Path(start.model).name} · strategy {start.strategy} · prompt of {len(start.prompt_tokens)} tokens"
        )
    for rnd in iter_rounds(events):
        acc = rnd.of_kind("accepted")
        if not acc:
            continue
        a = acc[0]
        parts = ["[" + "".join(show(p) for p in a.pieces[: a.n_accepted]) + "]" if a.n_accepted else ""]
        if a.bonus_piece is not None:
            parts.append(f"+{show(a.bonus_piece)}({a.bonus_kind})")
        for r in rnd.of_kind("rejected"):
            parts.append("~" + "".join(show(p) for p in r.pieces) + "~")
        rbs = ", ".join(f"{e.context} {e.from_pos}→{e.to_pos}" for e in rnd.of_kind("kv_rollback"))
        lines.append(
            f"round {rnd.index:>3}: " + " ".join(p for p in parts if p) + (f"   (rollback {rbs})" if rbs else "")
        )
    tel = [e for e in events if e.kind == "telemetry"]
    fin = next((e for e in events if e.kind == "finished"), None)
    if tel:
        t = tel[-1].data
        lines.append(
            f"{t['rounds']} rounds, {t['n_generated']} tokens, acceptance {t['acceptance_rate']:.0%}, "
            f"mean accepted length {t['mean_accepted_length']:.2f}" + (f", finished: {fin.reason}" if fin else "")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Record, then print or serve the recording."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="target GGUF (default: the embedded Gemma 3 270M)")
    ap.add_argument("--out", default="session.jsonl", help="the JSON Lines file to write")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--strategy", default="prompt-lookup")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: llama.cpp's choice)")
    ap.add_argument("--serve", action="store_true", help="show the recording in the Panel inspector")
    ap.add_argument("--port", type=int, default=5006)
    a = ap.parse_args(argv)

    from specviz.models.embedded import resolve_model

    out = Path(a.out)
    t = record(resolve_model(a.model), a.prompt, out, strategy=a.strategy, max_tokens=a.max_tokens, n_threads=a.threads)
    print(f"recorded {t['rounds']} rounds to {out} ({out.stat().st_size} bytes)\n")
    if a.serve:
        from specviz.server.app import replay

        replay(out, a.port)
    else:
        print(replay_text(out))


if __name__ == "__main__":
    main()
