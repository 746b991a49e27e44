"""Prompt suites by workload kind, used by the benchmarks, ``specviz bench`` and the equivalence tests.

Three kinds, as speculative decoding behaves very differently on each:

* ``code-rewrite``: rewrite or edit a given piece of code (the output repeats much of the input);
* ``quote``: summarise or quote a given text (the output copies spans of the input);
* ``free``: free generation (little to copy; speculation can only lose a little).

The code and the texts given in the ``code-rewrite`` and ``quote`` prompts are longer than the
benchmarks' 128-token budget, so that a faithful answer is copying from start to end, and the figures
measure the workload named rather than free text written after a short copy ended.
"""

from __future__ import annotations

_INVENTORY = '''class Inventory:
    """A store's stock: item names mapped to quantities and unit prices."""

    def __init__(self):
        self.quantities = {}
        self.prices = {}

    def add(self, name, quantity, price):
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self.quantities[name] = self.quantities.get(name, 0) + quantity
        self.prices[name] = price

    def remove(self, name, quantity):
        if self.quantities.get(name, 0) < quantity:
            raise ValueError("not enough " + name + " in stock")
        self.quantities[name] -= quantity
        if self.quantities[name] == 0:
            del self.quantities[name]
            del self.prices[name]

    def value(self):
        total = 0
        for name, quantity in self.quantities.items():
            total += quantity * self.prices[name]
        return total

    def report(self):
        lines = []
        for name in sorted(self.quantities):
            lines.append(name + ": " + str(self.quantities[name]))
        return "\\n".join(lines)
'''

_PARSER = '''def parse_config(text):
    """Parse lines of the form key = value into a dictionary."""
    result = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ValueError("line " + str(number) + ": expected key = value")
        key, value = line.split("=", 1)
        key = key.strip()
        value = value.strip()
        if value.lower() in ("true", "yes", "on"):
            value = True
        elif value.lower() in ("false", "no", "off"):
            value = False
        elif value.isdigit():
            value = int(value)
        result[key] = value
    return result


def merge_configs(base, override):
    """Return a new dictionary with the keys of override replacing those of base."""
    merged = dict(base)
    for key, value in override.items():
        merged[key] = value
    return merged
'''

_CART = '''function cartTotal(items, discountCode) {
  let subtotal = 0;
  for (let i = 0; i < items.length; i++) {
    const item = items[i];
    if (item.quantity <= 0) {
      throw new Error("invalid quantity for " + item.name);
    }
    subtotal += item.price * item.quantity;
  }
  let discount = 0;
  if (discountCode === "SPRING10") {
    discount = subtotal * 0.1;
  } else if (discountCode === "BULK" && items.length >= 5) {
    discount = subtotal * 0.15;
  }
  let shipping = 4.99;
  if (subtotal - discount >= 50) {
    shipping = 0;
  }
  return {
    subtotal: subtotal,
    discount: discount,
    shipping: shipping,
    total: subtotal - discount + shipping,
  };
}
'''

_LIGHTHOUSE = ("The lighthouse stood on the northern cliff for two hundred years. Every night its keeper climbed "
               "the ninety steps, trimmed the wick and wound the clockwork that turned the great lens. Ships "
               "passing the reef counted the flashes, three short and one long, and knew where they were. In "
               "the winter of the great storm the clockwork froze, and the keeper turned the lens by hand from "
               "dusk until dawn for eleven nights, while his daughter kept the lamp burning below. When the "
               "storm passed, the harbour master rowed out to thank them and found them both asleep on the "
               "gallery floor. The lens was replaced by an electric lamp in 1931, the last keeper left in "
               "1958, and today the tower is a museum where visitors can climb the same ninety steps and see "
               "the old clockwork, still stopped at the hour it froze.")
_PHOTOSYNTHESIS = ("Photosynthesis converts light energy into chemical energy. In the chloroplasts of plant "
                   "cells, pigments such as chlorophyll absorb light, mostly in the blue and red parts of the "
                   "spectrum. The absorbed energy splits water molecules, releasing oxygen as a by-product, and "
                   "is stored for a short time in two carrier molecules, ATP and NADPH. In a second set of "
                   "reactions, known as the Calvin cycle, these carriers supply the energy and the hydrogen "
                   "needed to turn carbon dioxide from the air into sugars. The sugars are used to build "
                   "starch, cellulose and the other molecules from which the plant grows. Nearly all life on "
                   "Earth depends on this process, directly or through the food chain, and the oxygen it "
                   "releases makes up about a fifth of the air we breathe.")
_MINUTES = ("The committee met on Tuesday evening in the council chamber to review the budget for the coming "
            "year. The chair opened the meeting at seven o'clock and the minutes of the previous meeting were "
            "approved without changes. The treasurer reported that income from the parking charges was higher "
            "than expected, while the cost of heating the town hall had risen by a third. After a long "
            "discussion the committee approved the new library wing, postponed the road repairs on Mill Lane "
            "until spring, and agreed to keep the swimming pool open on Sunday mornings through the summer. "
            "The treasurer was asked to prepare a report on the pension fund before the next meeting, and "
            "the clerk was asked to write to the county about the broken street lights near the station. The "
            "meeting closed at half past nine.")

WORKLOADS: dict[str, list[str]] = {
    "code-rewrite": [
        "Add type hints to this class and keep everything else the same:\n\n" + _INVENTORY
        + "\nWith type hints:\n\n",
        "Rewrite this code so that parse_config is called read_config:\n\n" + _PARSER + "\nRewritten code:\n\n",
        "Rename the variable subtotal to sub_total in this JavaScript function:\n\n" + _CART + "\nRenamed:\n\n",
        "Here is a Python class:\n\n" + _INVENTORY + "\nHere is the same class again, unchanged:\n\n",
    ],
    "quote": [
        "Text: " + _LIGHTHOUSE + "\n\nQuote the first four sentences of the text exactly:\n",
        "Read this passage:\n\n" + _PHOTOSYNTHESIS + "\n\nNow write out the passage again, word for word:\n\n",
        "Minutes: " + _MINUTES + "\n\nSummarise the minutes, quoting the decisions:\n",
        "Text: " + _LIGHTHOUSE + "\n\nCopy the text above:\n",
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
