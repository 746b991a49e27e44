"""Block drafts and chained drafters in the inspector, in a real chromium with a scripted host: a real session
(a chain of ngram-simple and a DFlash draft on tiny models) is recorded and its events fed to the page."""

from __future__ import annotations

import pytest
from browser_util import browser_fixture

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(events by round, the rounds' draft events) of a chain whose DFlash member drafts blocks."""
    from test_dflash import binary_head_output, binary_weights

    from specviz import Session
    from specviz.testing.tiny_dflash import write_tiny_dflash
    from specviz.testing.tiny_models import write_tiny_llama

    d = tmp_path_factory.mktemp("blk")
    target = write_tiny_llama(d / "target.gguf", n_layer=4, layers_from=binary_weights())
    head = write_tiny_dflash(
        d / "dflash.gguf",
        seed=6,
        output_weight=binary_head_output(),
        target_layers=(1, 2, 3),
        own_output=True,
        block_size=6,
    )
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(
        "the cat of the dog and the",
        60,
        "ngram-simple,draft-dflash",
        draft_model=str(head),
        draft_p_min=0.0,
        draft_max=4,
        size_n=2,
        size_m=4,
    )
    groups = [[e.to_dict() for e in s.events]]
    while s.finished is None:
        groups.append([e.to_dict() for e in s.step().events])
    s.close()
    drafts = [e for g in groups for e in g if e["kind"] == "draft_proposed"]
    return groups, drafts


def feed(page, groups):
    n = 0
    for g in groups:
        page.evaluate("m => window.__deliver(m)", {"type": "events", "epoch": 0, "start": n, "events": g})
        n += len(g)
    return n


def test_a_block_draft_is_one_block_with_each_positions_fate_and_the_drafter_is_named(browser, recorded):
    from specviz.testing.page_harness import open_harness

    groups, drafts = recorded
    blocks = [d for d in drafts if d["tokens"] and d["block"]]
    chained = [d for d in drafts if d["tokens"] and not d["block"]]
    assert blocks and chained  # both members drafted: the page has both kinds of round to show
    page = open_harness(browser)
    feed(page, groups)
    root = page.locator(".specviz-inspector")
    assert root.get_attribute("data-rounds") == str(len(drafts))
    # one boxed span per block round, led by a strip of one cell per block position
    assert page.locator(".sv-stream .sv-r.sv-blk").count() == len(blocks)
    n_acc = {e["round"]: e["n_accepted"] for g in groups for e in g if e["kind"] == "accepted"}
    first = next(d for d in blocks if n_acc[d["round"]] > 0)
    span = page.locator(f'.sv-r.sv-blk[data-round="{first["round"]}"]')
    cells = span.locator(".sv-blkstrip .sv-bp")
    assert cells.count() == first["block"]["positions"]
    assert span.locator(".sv-bp-accepted").count() == n_acc[first["round"]]
    assert "drafted in parallel" in span.get_attribute("title")
    assert span.get_attribute("data-drafter") == "dflash"
    # token rounds of the n-gram member are not blocks; a marker names the drafter wherever the chain switched
    assert page.locator(f'.sv-r[data-round="{chained[0]["round"]}"].sv-blk').count() == 0
    switches = sum(
        1 for i, d in enumerate(x for x in drafts if x["tokens"]) if i == 0 or d["drafter"] != prev_drafter(drafts, d)
    )
    assert page.locator(".sv-stream .sv-drafter").count() == switches
    # the token detail names the drafter and the block position
    span.locator(".sv-tok.sv-acc").first.hover()
    tip = page.locator(".sv-tip")
    tip.wait_for(state="visible")
    assert "dflash" in tip.inner_text() and "drafted in parallel" in tip.inner_text()


def prev_drafter(drafts, d):
    before = [x for x in drafts if x["tokens"] and x["round"] < d["round"]]
    return before[-1]["drafter"] if before else None


def test_a_rewind_rebuilds_the_blocks_and_the_markers(browser, recorded):
    from specviz.testing.page_harness import open_harness

    groups, drafts = recorded
    page = open_harness(browser)
    n = feed(page, groups)
    before_blocks = page.locator(".sv-stream .sv-r.sv-blk").count()
    before_marks = page.locator(".sv-stream .sv-drafter").count()
    last = drafts[-1]["round"]
    rewound = {
        "kind": "rewound",
        "round": last,
        "position": 0,
        "from_round": last,
        "from_position": 0,
        "n_events": n,
        "kept_tokens": [],
        "kept_pieces": [],
        "strategy": "ngram-simple,dflash",
        "knobs": {},
        "finished": None,
        "telemetry": {},
        "kv_rollbacks": [],
    }
    page.evaluate("m => window.__deliver(m)", {"type": "events", "epoch": 0, "start": n, "events": [rewound]})
    page.locator(".sv-rewindmark").wait_for()
    assert page.locator(".sv-stream .sv-r.sv-blk").count() == before_blocks
    assert page.locator(".sv-stream .sv-drafter").count() == before_marks
