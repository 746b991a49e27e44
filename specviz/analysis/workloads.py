"""Prompt suites by workload kind, used by the benchmarks, ``specviz bench`` and the equivalence tests.

Four kinds, as speculative decoding behaves very differently on each:

* ``code-rewrite``: rewrite or edit a given piece of code (the output repeats much of the input);
* ``quote``: quote a given text (the output is a long verbatim span of the input);
* ``summarise``: summarise or restate a given text (the output reuses phrases of the input, shortened,
  numbered or reordered);
* ``free``: free generation (little to copy; speculation can only lose a little).

Quoting and summarising are two kinds: a quote copies whole sentences, a restatement only phrases, and a
median over a mix of the two would measure neither.

The kind of a prompt is what the model does with it, not only what it asks: the embedded model is a
small base model and follows a request to quote only in some phrasings. Every ``quote`` prompt is one
whose greedy answer from the embedded model is a quote — at least 90% of it in spans of 8 or more
tokens copied from the prompt (:func:`copied_fraction`), which a test checks. A request to quote that
the model answers with numbered, shortened sentences is a restatement and sits in ``summarise``.

The code and the texts given in the ``code-rewrite``, ``quote`` and ``summarise`` prompts are longer than
the benchmarks' 128-token budget, so that a faithful answer is copying from start to end, and the figures
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

_CART = """function cartTotal(items, discountCode) {
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
"""

_LIGHTHOUSE = (
    "The lighthouse stood on the northern cliff for two hundred years. Every night its keeper climbed "
    "the ninety steps, trimmed the wick and wound the clockwork that turned the great lens. Ships "
    "passing the reef counted the flashes, three short and one long, and knew where they were. In "
    "the winter of the great storm the clockwork froze, and the keeper turned the lens by hand from "
    "dusk until dawn for eleven nights, while his daughter kept the lamp burning below. When the "
    "storm passed, the harbour master rowed out to thank them and found them both asleep on the "
    "gallery floor. The lens was replaced by an electric lamp in 1931, the last keeper left in "
    "1958, and today the tower is a museum where visitors can climb the same ninety steps and see "
    "the old clockwork, still stopped at the hour it froze."
)
_PHOTOSYNTHESIS = (
    "Photosynthesis converts light energy into chemical energy. In the chloroplasts of plant "
    "cells, pigments such as chlorophyll absorb light, mostly in the blue and red parts of the "
    "spectrum. The absorbed energy splits water molecules, releasing oxygen as a by-product, and "
    "is stored for a short time in two carrier molecules, ATP and NADPH. In a second set of "
    "reactions, known as the Calvin cycle, these carriers supply the energy and the hydrogen "
    "needed to turn carbon dioxide from the air into sugars. The sugars are used to build "
    "starch, cellulose and the other molecules from which the plant grows. Nearly all life on "
    "Earth depends on this process, directly or through the food chain, and the oxygen it "
    "releases makes up about a fifth of the air we breathe."
)
_MINUTES = (
    "The committee met on Tuesday evening in the council chamber to review the budget for the coming "
    "year. The chair opened the meeting at seven o'clock and the minutes of the previous meeting were "
    "approved without changes. The treasurer reported that income from the parking charges was higher "
    "than expected, while the cost of heating the town hall had risen by a third. After a long "
    "discussion the committee approved the new library wing, postponed the road repairs on Mill Lane "
    "until spring, and agreed to keep the swimming pool open on Sunday mornings through the summer. "
    "The treasurer was asked to prepare a report on the pension fund before the next meeting, and "
    "the clerk was asked to write to the county about the broken street lights near the station. The "
    "meeting closed at half past nine."
)

_BREAD = (
    "To make a simple loaf, mix five hundred grams of strong white flour with ten grams of salt and seven "
    "grams of dried yeast in a large bowl. Add three hundred and fifty millilitres of warm water and stir "
    "until the dough comes together. Turn it out onto a floured table and knead it for ten minutes, until "
    "it is smooth and springs back when pressed. Put the dough back in the bowl, cover it with a damp "
    "cloth and leave it somewhere warm for an hour, until it has doubled in size. Knock it back, shape it "
    "into a round and place it on a baking tray. Leave it to rise for another forty minutes while the oven "
    "heats to two hundred and twenty degrees. Bake the loaf for thirty minutes, until it is golden brown "
    "and sounds hollow when tapped underneath, then let it cool on a wire rack before slicing."
)
_NOTICE = (
    "From Monday the first of March, the number 12 bus will no longer stop on Station Road while the "
    "bridge is being repaired. Passengers for the station should use the temporary stop outside the "
    "post office on Church Street, about two hundred metres further on. The last bus from the town "
    "centre will leave at twenty past eleven instead of eleven o'clock, to allow for the longer route. "
    "Season tickets remain valid on all routes, and children under five continue to travel free. The "
    "repairs are expected to take six weeks. We apologise for the inconvenience and thank passengers "
    "for their patience. For the latest times, ask the driver or call the travel line, which is open "
    "from seven in the morning until eight in the evening every day except Christmas Day."
)

WORKLOADS: dict[str, list[str]] = {
    "code-rewrite": [
        "Add type hints to this class and keep everything else the same:\n\n" + _INVENTORY + "\nWith type hints:\n\n",
        "Rewrite this code so that parse_config is called read_config:\n\n" + _PARSER + "\nRewritten code:\n\n",
        "Rename the variable subtotal to sub_total in this JavaScript function:\n\n" + _CART + "\nRenamed:\n\n",
        "Here is a Python class:\n\n" + _INVENTORY + "\nHere is the same class again, unchanged:\n\n",
    ],
    "quote": [
        "Text: " + _LIGHTHOUSE + "\n\nQuote the first four sentences of the text exactly:\n",
        "Text: " + _MINUTES + "\n\nCopy the text above:\n",
        "Text: " + _PHOTOSYNTHESIS + '\n\nThe text, quoted in full:\n"',
        "Text: " + _BREAD + '\n\nThe text, quoted in full:\n"',
    ],
    "summarise": [
        "Minutes: " + _MINUTES + "\n\nSummarise the minutes, quoting the decisions:\n",
        # asked for a quote, the model numbers the sentences and drops clauses: a restatement
        "Read this passage:\n\n" + _PHOTOSYNTHESIS + "\n\nNow write out the passage again, word for word:\n\n",
        "Text: " + _LIGHTHOUSE + "\n\nSummarise the text in three sentences:\n",
        "Notice: " + _NOTICE + "\n\nSummarise the notice for a passenger in a hurry:\n",
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
    + WORKLOADS["quote"][:1]
    + WORKLOADS["summarise"][:2]
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


def copied_fraction(prompt_tokens: list[int], output_tokens: list[int], span: int = 8) -> float:
    """The share of ``output_tokens`` that lies in runs of at least ``span`` tokens also found in the prompt.

    1.0 is a verbatim quote; a summary that reuses only short phrases scores low. It is how much of an
    answer the draftless strategies can find in the prompt (an answer that repeats itself offers more
    on top), and what tells ``quote`` from ``summarise``.
    """
    if span < 1:
        raise ValueError(f"span must be at least 1, got {span}")
    if not output_tokens:
        return 0.0
    seen = {tuple(prompt_tokens[i : i + span]) for i in range(len(prompt_tokens) - span + 1)}
    covered = [False] * len(output_tokens)
    for i in range(len(output_tokens) - span + 1):
        if tuple(output_tokens[i : i + span]) in seen:
            covered[i : i + span] = [True] * span
    return sum(covered) / len(output_tokens)
