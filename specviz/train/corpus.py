"""The prompt corpus a head is trained on: specviz's own varied prompts, the built-in workloads that are not
held out, and a user's JSONL.

A head learns to predict what the *target* writes, so the prompts only need to make the target write the
kinds of text it will be asked for: stories, explanations, lists, instructions, letters, dialogue, questions
and answers, code, summaries and restatements of a given text. Nothing can be downloaded here, so the
built-in corpus is written in this module (every passage and word list below was written for specviz)
and expanded procedurally: frames (``"Here are some tips for {activity}:"``) filled with subjects, places,
names and activities, each passage under several instructions. :func:`builtin_prompts` returns a few
thousand distinct prompts in a seeded order, so any prefix of the list is a varied mix.

Held out for the evaluation: every built-in workload prompt of the ``free`` and ``summarise`` kinds, and
every other workload prompt that quotes the same passage as one of them (the ``quote`` prompts over the
lighthouse, minutes and photosynthesis texts would otherwise teach the head those passages).
:func:`held_out_prompts` lists them; :func:`training_workload_prompts` is the rest. The corpus's own
passages are different texts (tested).

A user's prompts come from a JSONL file (:func:`read_prompts_jsonl`): one JSON object per line with a
``"prompt"`` or ``"text"`` string, or MT-bench/Spec-Bench ``"turns"`` (the first turn is used). They are
used as completion text, as ``specviz run --prompt`` uses a prompt.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from ..analysis.workloads import VARIED_PROMPTS, WORKLOADS
from ..errors import SpecvizError

__all__ = [
    "HELD_OUT_KINDS",
    "PromptFileError",
    "TrainPrompt",
    "builtin_prompts",
    "held_out_prompts",
    "read_prompts_jsonl",
    "training_prompts",
    "training_workload_prompts",
]

#: Workload kinds whose built-in prompts are kept out of training (the evaluation's prompts).
HELD_OUT_KINDS = ("free", "summarise")


class PromptFileError(SpecvizError, ValueError):
    """A prompt file cannot be read or has malformed lines (each named with file:line)."""


@dataclass(frozen=True)
class TrainPrompt:
    """One training prompt and where it came from (``builtin``, ``workload`` or ``user``)."""

    text: str
    source: str


# fmt: off
# -- word lists (written for specviz) ------------------------------------------------------------------------

SUBJECTS = [
    "the honeybee", "volcanoes", "the printing press", "the moon", "rainforests", "the human heart", "glaciers",
    "the steam engine", "coral reefs", "the Roman Empire", "electricity", "the octopus", "deserts", "the telephone",
    "black holes", "the ancient Egyptians", "bread", "the bicycle", "tides", "the immune system", "owls",
    "the Silk Road", "earthquakes", "chess", "the violin", "tea", "compost", "the internet", "whales",
    "the Great Wall of China", "clouds", "bridges", "the alphabet", "mushrooms", "the solar system", "paper",
    "lighthouses", "the Olympic Games", "rivers", "the microscope", "elephants", "windmills", "the Renaissance",
    "sleep", "bees and flowers", "the compass", "penguins", "salt", "the railway", "forests in winter",
    "the camera", "honey", "trains", "thunderstorms", "maps", "the library", "ants", "music", "mountains",
    "the ocean", "castles", "the calendar", "glass", "volcanic islands", "wolves", "cheese", "the clock", "rain",
    "dinosaurs", "the piano", "recycling", "wind power", "the post office", "sharks", "the kitchen garden",
    "mathematics", "the spider", "coffee", "the desert fox", "stars", "the human brain", "Antarctica", "cotton",
    "the vaccine", "the rainbow", "bats", "the printing of books", "canals", "the harvest", "the night sky", "snow",
    "the tortoise", "markets", "the ancient Greeks", "soap", "lakes", "the fire brigade", "the school day",
    "horses", "the museum", "airships", "butterflies",
]

PLACES = [
    "a village at the foot of the mountains", "a small fishing town", "a busy city street",
    "an old house by the sea", "a forest clearing", "a railway station at night", "a market square",
    "a farm in the valley", "a desert oasis", "a ship far from land", "a school on the hill",
    "a lighthouse keeper's cottage", "a bakery before dawn", "an island in the north", "a quiet library",
    "a mountain hut", "a garden behind a wall", "a river boat", "a castle in ruins", "a snowy town",
    "a space station", "a travelling circus", "a hospital ward", "a bookshop on a corner", "an orchard in autumn",
    "a harbour at sunrise", "a city of canals", "a cave by the shore",
]

NAMES = [
    "Anna", "Tom", "Maria", "James", "Lena", "Samuel", "Grace", "Oliver", "Nora", "Felix", "Ruth", "Daniel",
    "Clara", "Peter", "Ella", "Hugo", "Iris", "Leo", "Martha", "Oscar", "Sofia", "Victor", "Alice", "Ben", "Eva",
    "George", "Hannah", "Isaac", "Julia", "Karl", "Lucy", "Max",
]

ACTIVITIES = [
    "learning to draw", "growing tomatoes", "running a first marathon", "baking bread at home", "saving money",
    "learning to play the guitar", "keeping a diary", "painting with watercolours", "studying for an exam",
    "training a puppy", "starting a small business", "cooking for a large group", "writing a short story",
    "keeping houseplants alive", "learning to swim", "planning a long journey", "speaking in public",
    "sleeping better", "learning to code", "taking better photographs", "riding a bicycle in the city",
    "looking after chickens", "making new friends in a new town", "reading more books", "organising a kitchen",
    "hiking in the mountains", "repairing a puncture", "making jam", "knitting a scarf", "birdwatching",
    "teaching children to read", "camping in the rain",
]

JOBS = [
    "a baker", "a nurse", "a train driver", "a teacher", "a fisherman", "a gardener", "a librarian", "a carpenter",
    "a doctor", "a pilot", "a farmer", "a journalist", "a postman", "an astronomer", "a chef", "a musician",
    "a shopkeeper", "a firefighter", "a scientist", "a painter",
]

CODE_TASKS = [
    ("is_prime", "n", "return True if n is a prime number"),
    ("reverse_words", "sentence", "reverse the order of the words in a sentence"),
    ("count_vowels", "text", "count the vowels in a string"),
    ("fibonacci", "n", "return the first n Fibonacci numbers"),
    ("average", "numbers", "return the average of a list of numbers"),
    ("celsius_to_fahrenheit", "celsius", "convert a temperature from Celsius to Fahrenheit"),
    ("word_frequencies", "text", "count how often each word occurs in a text"),
    ("flatten", "nested", "flatten a list of lists into one list"),
    ("is_palindrome", "word", "check whether a word reads the same backwards"),
    ("merge_sorted", "a, b", "merge two sorted lists into one sorted list"),
    ("read_csv_rows", "path", "read a CSV file and return its rows as dictionaries"),
    ("factorial", "n", "return the factorial of n"),
    ("unique_items", "items", "return the items of a list without duplicates, keeping their order"),
    ("binary_search", "items, target", "find the index of target in a sorted list"),
    ("capitalise_words", "text", "capitalise the first letter of every word"),
    ("gcd", "a, b", "return the greatest common divisor of two numbers"),
    ("chunk", "items, size", "split a list into chunks of a given size"),
    ("parse_date", "text", "parse a date written as YYYY-MM-DD into a tuple of integers"),
    ("max_profit", "prices", "find the best profit from buying and selling a stock once"),
    ("to_snake_case", "name", "convert a CamelCase name to snake_case"),
]

# -- passages (written for specviz; none is, or paraphrases, a held-out workload text) -----------------------

PASSAGES = [
    (
        "The old stone bridge over the river was built by the monks of the abbey in the twelfth century. For "
        "six hundred years it carried carts, cattle and travellers between the two halves of the town. In the "
        "great flood of 1771 the water rose above the arches and swept away the chapel that stood in the "
        "middle of the bridge, but the arches themselves held. The town council widened the road in 1850 by "
        "adding iron footpaths on both sides. Since 1990 the bridge has been closed to cars, and on summer "
        "evenings it is full of people eating ice cream and watching the swans below."
    ),
    (
        "Water on Earth moves in a continuous cycle. The sun warms the surface of seas and lakes, and some of "
        "the water evaporates into the air as vapour. As the warm air rises it cools, and the vapour condenses "
        "into tiny droplets that form clouds. When the droplets join together and grow heavy, they fall as "
        "rain, snow or hail. Some of this water flows over the ground into streams and rivers, some soaks into "
        "the soil and becomes groundwater, and some is taken up by plants and released again through their "
        "leaves. Sooner or later almost all of it returns to the sea, and the cycle begins again."
    ),
    (
        "Our library will close for two weeks from the fourteenth of June while new shelves and lighting are "
        "installed. During this time, books can be returned through the slot in the side door, and no fines "
        "will be charged. The reading group will meet in the community hall on Tuesday evenings instead of the "
        "upstairs room. Children's story time is cancelled until the library reopens. The computers will be "
        "available again from the first day after reopening, and members can book them online as before. We "
        "thank our visitors for their patience and look forward to welcoming them back."
    ),
    (
        "To fix a flat bicycle tyre, first remove the wheel from the frame. Use two tyre levers to lift one "
        "side of the tyre over the rim, then pull out the inner tube. Pump a little air into the tube and "
        "listen or feel for the hole; holding it under water will show a stream of bubbles. Roughen the area "
        "around the hole with sandpaper, spread a thin layer of glue and wait until it is dry to the touch. "
        "Press the patch firmly onto the glue and hold it for a minute. Check the inside of the tyre for the "
        "thorn or glass that caused the puncture, put the tube back, refit the tyre and pump it up."
    ),
    (
        "The hedgehog is a small mammal covered in about five thousand sharp spines. It is active mostly at "
        "night, when it searches hedges and gardens for beetles, worms, slugs and caterpillars. When it is "
        "frightened it rolls into a tight ball so that only its spines can be seen. In autumn the hedgehog "
        "eats as much as it can and builds a nest of dry leaves, where it hibernates until the spring. Its "
        "numbers have fallen sharply in recent decades, and many gardeners now leave a small gap at the "
        "bottom of their fences so that hedgehogs can travel from one garden to the next."
    ),
    (
        "Mira had worked at the observatory for eleven years before she saw anything that nobody had seen "
        "before. On a cold night in February, while checking a routine set of photographs, she noticed a faint "
        "smudge of light that had not been there the week before. She measured its position three times, "
        "compared it with the star charts and sent a short message to the director. By morning, two other "
        "observatories had confirmed it: a new comet, moving slowly towards the sun. It was named after her, "
        "and for a few weeks in April it could be seen with the naked eye."
    ),
    (
        "The annual general meeting of the rowing club took place on Saturday afternoon in the boathouse. "
        "Forty-two members attended. The captain reported that the club had won four races during the "
        "season, including the junior regatta for the first time in ten years. The treasurer explained that "
        "the new roof had cost more than planned and proposed a small rise in the membership fee, which was "
        "accepted by a large majority. Two new coaches were welcomed, and members agreed to hold an open day "
        "in May to attract beginners. The meeting ended with a vote of thanks to the volunteers."
    ),
    (
        "Sourdough bread is made without packaged yeast. Instead, the baker keeps a starter: a mixture of "
        "flour and water in which wild yeasts and bacteria live together. The starter is fed with fresh flour "
        "and water every day. To make a loaf, some of the starter is mixed with more flour, water and salt, "
        "and the dough is left to rise slowly for many hours, often overnight. The long rise gives the bread "
        "its slightly sour taste and its open, chewy crumb. Many bakers say the starter becomes part of the "
        "family, and some have been kept alive for more than a hundred years."
    ),
    (
        "From next Monday, the car park behind the sports centre will be resurfaced. The work will take about "
        "ten days. During this period, visitors should use the overflow car park on Green Lane, which is a "
        "five-minute walk away. Cyclists can still use the bicycle racks near the main entrance. Blue badge "
        "holders may park in the four marked spaces on the front drive. The swimming pool, gym and cafe will "
        "stay open at the usual times. We are sorry for any inconvenience and thank you for your patience "
        "while we improve the facilities."
    ),
    (
        "The first public railway to carry passengers with steam locomotives opened in 1825. Before that, "
        "goods were moved by horse and cart or by canal boat, and a journey of fifty miles could take two "
        "days. Within twenty years thousands of miles of track had been laid across the country. Towns that "
        "the railway reached grew quickly, and fresh food, newspapers and letters could travel overnight. "
        "Clocks in different towns, which had each kept their own local time, were set to one standard time "
        "so that timetables could be printed. Many historians see the railway as the invention that made the "
        "modern world."
    ),
    (
        "Grandfather kept bees at the bottom of the orchard in three white hives. Every summer he put on his "
        "veil and gloves, lit the smoker with dry grass and lifted the frames one by one to see how the "
        "colonies were doing. He never hurried, and he talked to the bees in a low voice as he worked. In "
        "August he took the honey, spinning the frames in a metal drum in the kitchen until the air smelled "
        "of flowers. He gave jars to the neighbours, the doctor and the priest, and he always kept the last "
        "jar for winter colds."
    ),
    (
        "Sleep is not a time when the brain switches off. During the night we pass several times through "
        "cycles of light sleep, deep sleep and dreaming sleep, each cycle lasting about ninety minutes. Deep "
        "sleep helps the body repair itself, while dreaming sleep seems to help the brain store memories and "
        "deal with emotions. Adults need between seven and nine hours of sleep a night, and teenagers need "
        "more. Going to bed at the same time each day, keeping the bedroom dark and cool, and avoiding screens "
        "before bed can all help people sleep better."
    ),
]

CODE_SNIPPETS = [
    """def total_price(items):
    total = 0
    for item in items:
        total = total + item["price"] * item["count"]
    if total > 100:
        total = total * 0.9
    return total
""",
    """class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, word):
        if word in self.counts:
            self.counts[word] += 1
        else:
            self.counts[word] = 1

    def most_common(self, n):
        pairs = sorted(self.counts.items(), key=lambda p: p[1], reverse=True)
        return pairs[:n]
""",
    """function formatName(first, last, title) {
  let name = first + " " + last;
  if (title) {
    name = title + " " + name;
  }
  return name.trim();
}
""",
    """def load_scores(path):
    scores = {}
    with open(path) as f:
        for line in f:
            name, score = line.strip().split(",")
            scores[name] = int(score)
    return scores
""",
]

# -- frames ---------------------------------------------------------------------------------------------------

_SUBJECT_FRAMES = [
    "{S_cap} is",
    "The history of {s} begins",
    "Here are some interesting facts about {s}:\n\n1.",
    "An introduction to {s}\n\n",
    "Why is {s} important? ",
    "Q: What is special about {s}?\nA:",
    "Write a short poem about {s}.\n\n",
    "Ten things everyone should know about {s}:\n1.",
    "A children's encyclopedia entry on {s}.\n\n{S_cap}",
    "Explain {s} to a ten-year-old.\n\n",
    "The most surprising thing about {s} is that",
    "Chapter 1: {S_title}\n\n",
    "Question: How does {s} affect our daily lives?\nAnswer:",
    "In this essay I will discuss {s}.",
    "Notes for a school lesson on {s}:\n-",
    "Title: A Short Guide to {S_title}\n\n",
]
_PLACE_FRAMES = [
    "Once upon a time, in {p}, there lived",
    "It was late in the evening when {n} arrived in {p}.",
    "{N} had lived in {p} for as long as anyone could remember.",
    "The story begins in {p}, where",
    "Describe {p} in detail.\n\n",
    "Long ago, in {p}, a strange thing happened.",
    "Every morning in {p}, {n} would",
]
_NAME_FRAMES = [
    "{N} opened the letter and read:",
    "Dear {N},\n\nThank you for your letter. ",
    "{N}: Good morning! Did you hear the news?\n{M}:",
    "{N} was {j}, and every day",
    "Interview with {j}\n\nQ: How did you become {j}?\nA:",
    "{N} looked at the map and said,",
    "Diary of {N}, Monday.\n\nToday",
    "{N} and {M} had never agreed about anything, until",
]
_ACTIVITY_FRAMES = [
    "Here are some tips for {a}:",
    "A beginner's guide to {a}.\n\nStep 1:",
    "The five biggest mistakes people make when {a}:\n\n1.",
    "Q: What is the best way to get started with {a}?\nA:",
    "My experience of {a}.\n\n",
    "Frequently asked questions about {a}\n\n",
    "{A_cap} is easier than you think. First,",
]
_CODE_FRAMES = [
    'def {f}({args}):\n    """{D}."""\n',
    "# Python function to {d}\n",
    "Write a Python function that will {d}.\n\n```python\n",
    "# {D}\ndef {f}(",
    "Question: How do I {d} in Python?\nAnswer:",
]
_PASSAGE_FRAMES = [
    "Text: {x}\n\nSummarise the text in two sentences:\n",
    "Text: {x}\n\nSummarise the text for a child:\n",
    "Read this passage:\n\n{x}\n\nThe main points of the passage are:\n1.",
    "{x}\n\nIn short,",
    "Text: {x}\n\nQuestions about the text:\n1.",
    "Text: {x}\n\nWrite a headline for the text:\n",
    "Text: {x}\n\nCopy the first two sentences of the text:\n",
    "Passage: {x}\n\nRewrite the passage in simpler words:\n",
    "Text: {x}\n\nList the facts in the text:\n-",
    "Text: {x}\n\nQuote the last sentence of the text exactly:\n",
]
_CODE_SNIPPET_FRAMES = [
    "Add comments to this code:\n\n{c}\nWith comments:\n\n",
    "Explain what this code does:\n\n{c}\nExplanation:",
    "Rewrite this code to make it clearer:\n\n{c}\nRewritten:\n\n",
    "Here is some code:\n\n{c}\nHere is the same code again:\n\n",
    "Find the bug in this code:\n\n{c}\nAnswer:",
]
_MISC = [
    "1, 2, 3, 4, 5,",
    "Monday, Tuesday,",
    "January, February, March,",
    "A, B, C, D,",
    "10, 20, 30,",
    "Shopping list:\n- milk\n- eggs\n-",
    "Recipe: Vegetable soup\n\nIngredients:\n-",
    "<html>\n<head>\n  <title>My page</title>\n</head>\n<body>\n",
    '{\n  "name": "example",\n',
    "Table of contents\n\n1. Introduction\n2.",
    "The rules of the game are simple.",
    "Knock knock.\nWho's there?\n",
    "Breaking news: ",
    "Weather forecast for tomorrow:",
    "Meeting agenda\n\n1. Welcome\n2.",
    "Dear Sir or Madam,\n\nI am writing to",
    "Top 10 films of all time:\n\n1.",
]

# fmt: on


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _title(s: str) -> str:
    words = s.split()
    if words and words[0] == "the":
        words = words[1:]
    return " ".join(w[:1].upper() + w[1:] for w in words)


def builtin_prompts(seed: int = 0) -> list[str]:
    """Every prompt of the built-in corpus (a few thousand, distinct), in a seeded order."""
    out: list[str] = []
    for s in SUBJECTS:
        for fr in _SUBJECT_FRAMES:
            out.append(fr.format(s=s, S_cap=_cap(s), S_title=_title(s)))
    for i, p in enumerate(PLACES):
        for k, fr in enumerate(_PLACE_FRAMES):
            n = NAMES[(i + k) % len(NAMES)]
            out.append(fr.format(p=p, n=n, N=n))
    for i, n in enumerate(NAMES):
        for k, fr in enumerate(_NAME_FRAMES):
            m = NAMES[(i + k + 5) % len(NAMES)]
            out.append(fr.format(N=n, M=m, j=JOBS[(i + 3 * k) % len(JOBS)]))
    for a in ACTIVITIES:
        for fr in _ACTIVITY_FRAMES:
            out.append(fr.format(a=a, A_cap=_cap(a)))
    for f, args, d in CODE_TASKS:
        for fr in _CODE_FRAMES:
            out.append(fr.format(f=f, args=args, d=d, D=_cap(d)))
    for x in PASSAGES:
        for fr in _PASSAGE_FRAMES:
            out.append(fr.format(x=x))
    for c in CODE_SNIPPETS:
        for fr in _CODE_SNIPPET_FRAMES:
            out.append(fr.format(c=c))
    out.extend(_MISC)
    seen: set[str] = set()
    uniq = [p for p in out if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]
    random.Random(seed).shuffle(uniq)
    return uniq


def _passages_of(prompt: str) -> set[str]:
    """The workload passages (long texts) a workload prompt contains."""
    from ..analysis import workloads as w

    texts = [getattr(w, n) for n in dir(w) if n.startswith("_") and isinstance(getattr(w, n), str)]
    return {t for t in texts if len(t) > 200 and t in prompt}


def held_out_prompts() -> list[str]:
    """The evaluation's prompts: the ``free`` and ``summarise`` workloads (never trained on)."""
    return [p for k in HELD_OUT_KINDS for p in WORKLOADS[k]]


def training_workload_prompts() -> list[str]:
    """Built-in workload prompts that may be trained on: not held out, sharing no passage with a held-out one."""
    held = held_out_prompts()
    held_passages = set().union(*(_passages_of(p) for p in held))
    out = []
    for kind, prompts in WORKLOADS.items():
        if kind in HELD_OUT_KINDS:
            continue
        out += [p for p in prompts if not (_passages_of(p) & held_passages)]
    out += [p for p in VARIED_PROMPTS if p not in held and p not in out and not (_passages_of(p) & held_passages)]
    return out


def read_prompts_jsonl(path: str | Path) -> list[str]:
    """Prompts from a JSONL file: per line an object with ``"prompt"``, ``"text"`` or ``"turns"`` (first turn).

    Blank lines are skipped. Raises :class:`PromptFileError` listing every malformed line (``file:line``).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PromptFileError(f"{p}: cannot read the prompt file ({e})") from None
    out: list[str] = []
    bad: list[str] = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            bad.append(f"{p}:{i}: not JSON ({e.msg})")
            continue
        prompt = None
        if isinstance(obj, dict):
            for key in ("prompt", "text"):
                if isinstance(obj.get(key), str) and obj[key]:
                    prompt = obj[key]
                    break
            turns = obj.get("turns")
            if prompt is None and isinstance(turns, list) and turns and isinstance(turns[0], str) and turns[0]:
                prompt = turns[0]
        if prompt is None:
            bad.append(f'{p}:{i}: expected an object with a non-empty "prompt", "text" or "turns"')
            continue
        out.append(prompt)
    if bad:
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        raise PromptFileError("; ".join(bad[:3]) + more)
    if not out:
        raise PromptFileError(f"{p}: no prompts in the file")
    return out


def training_prompts(user: list[str] | None = None, *, seed: int = 0, builtin: bool = True) -> list[TrainPrompt]:
    """The training prompts in the order they are generated from: the user's and the training workloads
    first (so a short run still covers them), then the built-in corpus. Held-out prompts (and any prompt
    containing one) are removed, whatever their source."""
    held = held_out_prompts()
    out = [TrainPrompt(t, "user") for t in (user or [])]
    if builtin:
        out += [TrainPrompt(t, "workload") for t in training_workload_prompts()]
        out += [TrainPrompt(t, "builtin") for t in builtin_prompts(seed)]
    out = [p for p in out if not any(h in p.text for h in held)]
    seen: set[str] = set()
    return [p for p in out if not (p.text in seen or seen.add(p.text))]  # type: ignore[func-returns-value]
