"""Prompt suites by workload kind, used by the benchmarks, ``specviz bench`` and the equivalence tests.

Three kinds, as speculative decoding behaves very differently on each:

* ``code-rewrite``: rewrite or edit a given piece of code (the output repeats much of the input);
* ``quote``: summarise or quote a given text (the output copies spans of the input);
* ``free``: free generation (little to copy; speculation can only lose a little).
"""

from __future__ import annotations

_FIB = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b
'''

_STACK = '''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

    def is_empty(self):
        return len(self.items) == 0
'''

_JS = '''function sumEven(values) {
  let total = 0;
  for (let i = 0; i < values.length; i++) {
    if (values[i] % 2 === 0) {
      total += values[i];
    }
  }
  return total;
}
'''

_TEXT_1 = ("The lighthouse stood on the northern cliff for two hundred years. Every night its keeper climbed "
           "the ninety steps, trimmed the wick and wound the clockwork that turned the great lens. Ships "
           "passing the reef counted the flashes, three short and one long, and knew where they were.")
_TEXT_2 = ("Photosynthesis converts light energy into chemical energy. In the chloroplasts, light splits "
           "water molecules, releasing oxygen, while the energy captured drives the synthesis of sugars "
           "from carbon dioxide. Nearly all life on Earth depends on this process.")
_TEXT_3 = ("The committee met on Tuesday to review the budget. It approved the new library wing, postponed "
           "the road repairs until spring, and asked the treasurer to prepare a report on the pension fund "
           "before the next meeting.")

WORKLOADS: dict[str, list[str]] = {
    "code-rewrite": [
        "Rewrite this function with the variable names a and b renamed to prev and curr:\n\n" + _FIB
        + "\nRewritten:\n\n",
        "Add type hints to this class and keep everything else the same:\n\n" + _STACK + "\nWith type hints:\n\n",
        "Convert this JavaScript function to use const where possible, changing nothing else:\n\n" + _JS
        + "\nConverted:\n\n",
        "Here is a Python function:\n\n" + _FIB + "\nHere is the same function again, unchanged:\n\n",
    ],
    "quote": [
        "Text: " + _TEXT_1 + "\n\nQuote the first two sentences of the text exactly:\n",
        "Text: " + _TEXT_2 + "\n\nRepeat the text word for word:\n",
        "Minutes: " + _TEXT_3 + "\n\nSummarise the minutes, quoting the decisions:\n",
        "Text: " + _TEXT_1 + "\n\nCopy the text above:\n",
    ],
    "free": [
        "Once upon a time, in a village at the edge of a great forest,",
        "The three most important inventions of the nineteenth century were",
        "Here are some tips for learning a new language:",
        "The weather today is",
    ],
}

#: Ten or more varied prompts for equivalence checks (every kind, plus lists, numbers and dialogue).
VARIED_PROMPTS: list[str] = (
    WORKLOADS["code-rewrite"][:3]
    + WORKLOADS["quote"][:3]
    + WORKLOADS["free"][:3]
    + [
        "1, 2, 3, 4, 5, 6, 7, 8,",
        "Q: What is the capital of France?\nA: Paris.\nQ: What is the capital of Italy?\nA:",
        "<ul>\n  <li>apples</li>\n  <li>pears</li>\n  <li>",
    ]
)


def workload_kinds() -> list[str]:
    """The workload kinds, in report order."""
    return list(WORKLOADS)
