"""A served page that a background thread sends numbered messages to, through specviz's OrderedSender.

The page's module records every message it gets
(``data-count``, ``data-last``, ``data-disorder`` on its element) and says ``ready`` once; then a thread sends
``N`` bursts of 2 to 5 messages of ``PAD`` bytes, each burst followed by a wait (at most 2 s) for the page to
have the burst's last message: a message left unsent is not flushed by a later one, and counts as stuck;
a last message (``done``) reports how many bursts got stuck. The page answers each message with an
``ack`` (as the inspector answers with commands and hellos), so the server's replies to the page often hold
the websocket while a message is sent: the case in which Panel's own write queue can leave the last message
of a burst unsent (see :class:`specviz.ui.panel_app.OrderedSender`).

Run as ``python tests/apps/ordered_sender_app.py PORT N PAD``.
"""

from __future__ import annotations

import random
import sys
import threading
import time

import panel as pn

from specviz.ui.panel_app import OrderedSender, PageComponent

ESM = """
export function render({ model, el }) {
  const box = document.createElement("div");
  box.className = "sender-probe";
  box.dataset.count = "0";
  box.dataset.last = "-1";
  box.dataset.disorder = "0";
  el.append(box);
  let count = 0, last = -1, disorder = 0;
  model.on("msg:custom", (msg) => {
    count += 1;
    if (msg.i !== last + 1) disorder += 1;
    last = msg.i;
    box.dataset.count = String(count);
    box.dataset.last = String(last);
    box.dataset.disorder = String(disorder);
    if (msg.done) box.dataset.stuck = String(msg.stuck);
    model.send_msg({ type: "ack", i: msg.i });
  });
  model.send_msg({ type: "ready" });
}
"""


class Probe(PageComponent):
    """Counts the messages it is sent (in its page) and says when it is ready."""

    _esm = ESM

    def __init__(self, n: int, pad: int, **params):
        super().__init__(**params)
        self._n, self._pad = n, pad
        self._send = OrderedSender(self, pn.state.curdoc)
        self._started = False
        self._acked = -1
        self._acked_lock = threading.Lock()
        self._ack_event = threading.Event()

    def _handle_msg(self, data) -> None:
        if data == {"type": "ready"} and not self._started:
            self._started = True
            threading.Thread(target=self._bursts, daemon=True).start()
        elif isinstance(data, dict) and data.get("type") == "ack":
            with self._acked_lock:
                self._acked = max(self._acked, data["i"])
            self._ack_event.set()

    def _wait_ack(self, i: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            with self._acked_lock:
                if self._acked >= i:
                    return True
                self._ack_event.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._ack_event.wait(left)

    def _bursts(self) -> None:
        rng = random.Random(0)
        pad = "x" * self._pad
        i, stuck = 0, 0
        while i < self._n:
            for _ in range(rng.randint(2, 5)):
                self._send({"i": i, "pad": pad})
                i += 1
                time.sleep(rng.uniform(0.0, 0.003))
            # then nothing more until the page has the burst's last message: a message left unsent stays so
            if not self._wait_ack(i - 1, 2.0):
                stuck += 1
        self._send({"i": i, "done": True, "stuck": stuck})


def main() -> None:
    port, n, pad = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    pn.serve({"/": lambda: Probe(n, pad)}, port=port, address="127.0.0.1", show=False, threaded=False)


if __name__ == "__main__":
    main()
