"""Draft trees in the inspector (issue 56), in a real chromium with no network: synthetic tree rounds
(:func:`specviz.testing.synthetic.synthetic_tree_rounds`) fed to the front-end on a scripted host show the Draft
tree card: every node with its token, the accepted path, the refused and the never-reached nodes, the target's
choice at each depth with its alternatives on hover; a chain round keeps the chain view. The same rounds
recorded and replayed show the tree in the Panel app (``specviz replay``) and in JupyterLab
(``Inspector.replay``)."""

from __future__ import annotations

import pytest
from browser_util import SCREENSHOTS, browser_fixture, free_port, offline, start, stop, wait_http

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


@pytest.fixture(scope="module")
def groups():
    """The synthetic tree session's events, grouped by round."""
    from specviz.testing.synthetic import synthetic_tree_rounds

    return synthetic_tree_rounds(8, seed=3)


@pytest.fixture(scope="module")
def recording(groups, tmp_path_factory):
    """The same session written by the recorder."""
    from specviz.decoding.events import event_from_dict
    from specviz.decoding.recorder import Recorder

    path = tmp_path_factory.mktemp("tree-rec") / "tree.jsonl"
    with Recorder(path) as rec:
        for g in groups:
            for e in g:
                rec(event_from_dict(e))
    return path


@pytest.fixture(scope="module")
def real_groups(tmp_path_factory):
    """A real session's tree rounds (the draft model branching on the tiny pair), recorded and read back, by round."""
    from specviz import Session
    from specviz.decoding.recorder import Recorder, read_events
    from specviz.testing.tiny_models import tiny_weights, write_tiny_llama

    d = tmp_path_factory.mktemp("tree-real")
    tiny = {"seed": 1, "block_scale": 0.1}
    target = write_tiny_llama(d / "target.gguf", **tiny)
    draft = write_tiny_llama(d / "draft.gguf", n_layer=1, layers_from=tiny_weights(**tiny))
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=3)
    with Recorder(d / "real.jsonl") as rec:
        s.subscribe(rec)
        # no alignment to the verify tile, so the trees grow past one level: three branches, eight nodes
        s.start(
            "The quick brown fox",
            30,
            "draft",
            draft_model=str(draft),
            draft_p_min=0.0,
            draft_max=8,
            align=False,
            tree_width=3,
            p_split=0.05,
        )
        while s.finished is None:
            s.step()
    s.close()
    groups: list[list[dict]] = []
    for e in read_events(d / "real.jsonl"):
        if not groups or e.kind == "draft_proposed" or e.kind == "session_started":
            groups.append([])
        groups[-1].append(e.to_dict())
    return groups


def tree_rounds(groups) -> list[dict]:
    """Per tree round: its number, tree, accepted path, the target's choices and each node's expected fate."""
    out = []
    for g in groups:
        by = {e["kind"]: e for e in g}
        d = by.get("draft_proposed")
        if not d or not d["tree"]:
            continue
        t, path = d["tree"], by["accepted"]["tree_path"]
        read = {-1, *path}  # the rows the target read: the pending token's and the accepted nodes'
        fate = []
        for i, p in enumerate(t["parents"]):
            fate.append("accepted" if i in path else "rejected" if p in read else "unreached")
        out.append(
            {"round": d["round"], "tree": t, "path": path, "choices": by["verified"]["tree_choices"], "fate": fate}
        )
    return out


def feed(page, groups) -> int:
    n = 0
    for g in groups:
        page.evaluate("m => window.__deliver(m)", {"type": "events", "epoch": 0, "start": n, "events": g})
        n += len(g)
    return n


def show_tree_round(page, index: int) -> None:
    """Move the tree card's slider to its ``index``-th tree round, as a person would."""
    page.eval_on_selector(
        ".sv-tree-slider", "(e, i) => { e.value = String(i); e.dispatchEvent(new Event('input')); }", index
    )


def check_tree(card, r: dict) -> None:
    """The card shows tree round ``r``: each node with its token and fate, the path, the target's choices."""
    from playwright.sync_api import expect

    expect(card).to_have_attribute("data-round", str(r["round"]))
    assert card.get_attribute("data-kind") == "tree"
    t = r["tree"]
    nodes = card.locator(".sv-tree-node[data-status]")
    expect(nodes).to_have_count(len(t["tokens"]))
    for i, tok in enumerate(t["tokens"]):
        node = card.locator(f'.sv-tree-node[data-node="{i}"]')
        assert node.get_attribute("data-token") == str(tok)
        assert node.get_attribute("data-status") == r["fate"][i], (r["round"], i)
        assert node.get_attribute("data-depth") == str(t["depths"][i])
        cls = node.get_attribute("class") or ""
        assert {"accepted": "sv-acc", "rejected": "sv-rej", "unreached": "sv-tree-unreached"}[r["fate"][i]] in cls
        assert f"{t['probs'][i]:.3f}" in node.inner_text()
    assert card.get_attribute("data-path") == ",".join(str(i) for i in r["path"])
    assert card.locator(".sv-tree-edge").count() == len(t["tokens"])
    assert card.locator(".sv-tree-edge-accepted").count() == len(r["path"])
    choices = card.locator(".sv-tree-choice")
    expect(choices).to_have_count(len(r["choices"]))
    assert [choices.nth(k).get_attribute("data-token") for k in range(len(r["choices"]))] == [
        str(c["token"]) for c in r["choices"]
    ]


def test_the_tree_view_shows_each_nodes_fate_and_the_targets_choices(browser, groups):
    from specviz.testing.page_harness import open_harness

    rounds = tree_rounds(groups)
    assert len(rounds) >= 4
    page = open_harness(browser, viewport={"width": 1320, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    feed(page, groups)
    card = page.locator(".sv-tree-card")
    card.wait_for()
    assert card.get_attribute("data-trees") == str(len(rounds))
    check_tree(card, rounds[-1])  # it follows the newest tree round
    # round 1 accepted a side branch to its leaf, round 2 nothing, round 3 stopped inside the main line
    for k in range(3):
        show_tree_round(page, k)
        check_tree(card, rounds[k])
    show_tree_round(page, 1)
    r = rounds[1]
    assert r["path"] == [] and "unreached" in r["fate"] and "rejected" in r["fate"]
    show_tree_round(page, 0)
    assert card.locator(".sv-tree-choice").last.get_attribute("data-kind") == "bonus"  # the whole branch accepted
    # a round with every fate: accepted, refused and never-reached nodes
    k = next(k for k, r in enumerate(rounds) if {"accepted", "rejected", "unreached"} <= set(r["fate"]))
    show_tree_round(page, k)
    r = rounds[k]
    check_tree(card, r)
    last = r["choices"][-1]
    # hover the target's last choice: its alternatives, the chosen one and the drafted ones marked
    card.locator(".sv-tree-choice").last.hover()
    tip = card.locator(".sv-tree-tip")
    tip.wait_for(state="visible")
    alts = tip.locator(".sv-tree-alt")
    assert alts.count() == len(last["alternatives"]) + 1  # the choice, then the row's next most probable tokens
    assert [alts.nth(k).get_attribute("data-token") for k in range(alts.count())] == [
        str(a[0]) for a in [[last["token"]], *last["alternatives"]]
    ]
    assert "chosen" in alts.first.inner_text()
    # hover a refused node: its fate and what the target chose at its depth
    rej = next(i for i, f in enumerate(r["fate"]) if f == "rejected")
    card.locator(f'.sv-tree-node[data-node="{rej}"]').hover()
    assert "rejected" in tip.inner_text() and "target chose" in tip.inner_text()
    page.mouse.move(2, 2)
    tip.wait_for(state="hidden")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    card.screenshot(path=str(SCREENSHOTS / "draft_tree.png"))
    assert errors == [] and page.external_requests == []


def test_a_real_sessions_recorded_tree_rounds_show_in_the_tree_view(browser, real_groups):
    """The events a session publishes for its tree rounds (recorded, read back) draw each round's tree."""
    from specviz.testing.page_harness import open_harness

    rounds = tree_rounds(real_groups)
    assert rounds, "the session drafted no tree"
    assert any({"accepted", "rejected", "unreached"} <= set(r["fate"]) for r in rounds)  # every fate drawn
    page = open_harness(browser)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    feed(page, real_groups)
    card = page.locator(".sv-tree-card")
    card.wait_for()
    assert card.get_attribute("data-trees") == str(len(rounds))
    check_tree(card, rounds[-1])
    for k in range(min(len(rounds), 6)):
        show_tree_round(page, k)
        check_tree(card, rounds[k])
    # hover the target's final choice: the choice first, then the row's next most probable tokens
    last = rounds[-1]["choices"][-1]
    show_tree_round(page, len(rounds) - 1)
    card.locator(".sv-tree-choice").last.hover()
    alts = card.locator(".sv-tree-tip .sv-tree-alt")
    assert [alts.nth(k).get_attribute("data-token") for k in range(alts.count())] == [
        str(a[0]) for a in [[last["token"]], *last["alternatives"]]
    ]
    assert errors == [] and page.external_requests == []


def test_a_chain_round_keeps_the_chain_view(browser, groups):
    from specviz.testing.page_harness import open_harness

    rounds = {r["round"] for r in tree_rounds(groups)}
    chains = [
        e for g in groups for e in g if e["kind"] == "draft_proposed" and e["tree"] is None and e["round"] not in rounds
    ]
    assert chains
    page = open_harness(browser)
    feed(page, groups)
    card = page.locator(".sv-tree-card")
    card.wait_for()
    # the stream marks the tree rounds and shows every round's kept branch as a chain
    assert page.locator(".sv-stream .sv-r.sv-treeround").count() == len(rounds)
    chain = chains[0]["round"]
    span = page.locator(f'.sv-stream .sv-r[data-round="{chain}"]')
    assert "sv-treeround" not in (span.get_attribute("class") or "")
    span.locator(".sv-tok").first.click()
    from playwright.sync_api import expect

    expect(card).to_have_attribute("data-round", str(chain))
    assert card.get_attribute("data-kind") == "chain"
    assert card.locator(".sv-tree-note").is_visible() and "chain" in card.locator(".sv-tree-note").inner_text()
    assert card.locator(".sv-tree-node").count() == 0
    # a token of a tree round shows its tree again
    tree_round = min(rounds)
    page.locator(f'.sv-stream .sv-r[data-round="{tree_round}"] .sv-tok').first.click()
    expect(card).to_have_attribute("data-round", str(tree_round))
    assert card.get_attribute("data-kind") == "tree"
    # a session without trees has no tree card
    from specviz.testing.synthetic import synthetic_rounds

    plain = [e for g in synthetic_rounds(40, seed=1) for e in g]
    page.evaluate("m => window.__deliver(m)", {"type": "events", "epoch": 1, "start": 0, "events": plain})
    page.wait_for_function("document.querySelector('.specviz-inspector').dataset.events === '%d'" % len(plain))
    assert card.is_hidden()


def test_a_replayed_tree_recording_in_the_panel_app(browser, groups, recording, tmp_path):
    rounds = tree_rounds(groups)
    port = free_port()
    proc = start(["-m", "specviz.server.app", "replay", str(recording), "--port", str(port)], tmp_path / "replay.log")
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_http(url, proc)
        page = browser.new_page(viewport={"width": 1320, "height": 1100})
        external = offline(page)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        from playwright.sync_api import expect

        card = page.locator(".sv-tree-card")
        expect(card).to_have_attribute("data-trees", str(len(rounds)), timeout=60000)
        check_tree(card, rounds[-1])
        show_tree_round(page, 0)
        check_tree(card, rounds[0])
        page.close()
        assert external == [] and errors == []
    finally:
        stop(proc)


def test_a_replayed_tree_recording_in_jupyterlab(browser, groups, recording, tmp_path):
    """``Inspector.replay(path)`` in a notebook on loopback shows the same trees."""
    pytest.importorskip("jupyterlab")
    import secrets

    import nbformat
    from playwright.sync_api import expect

    from specviz.testing.page_harness import jupyterlab_args

    rounds = tree_rounds(groups)
    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    code = f"from specviz import Inspector\nw = Inspector.replay({str(recording)!r})\nw"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(nbdir / "tree.ipynb"))
    port, token = free_port(), secrets.token_hex(16)
    env = {"JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "ws")}
    proc = start(jupyterlab_args(port, token, str(nbdir)), tmp_path / "lab.log", env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", proc, timeout=120)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        external = offline(page)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{port}/lab/tree/tree.ipynb?reset&token={token}")
        page.wait_for_selector(".jp-Notebook", timeout=120000)
        try:  # some Lab versions still ask for the kernel despite the notebook's kernelspec
            page.locator(".jp-Dialog .jp-mod-accept").click(timeout=8000)
        except Exception:
            pass
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120000)
        page.locator(".lm-MenuBar-itemLabel").get_by_text("Run", exact=True).click()
        page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
        card = page.locator(".specviz-inspector .sv-tree-card").first
        expect(card).to_have_attribute("data-trees", str(len(rounds)), timeout=180000)
        check_tree(card, rounds[-1])
        page.close()
        assert external == [] and errors == []
    finally:
        stop(proc)
