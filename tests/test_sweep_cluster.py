"""Sweeps on Dask: a 2-worker LocalCluster gives the local run's results, and a killed worker loses nothing."""

from __future__ import annotations

import json
import logging
import os
import signal

import pytest

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")
distributed = pytest.importorskip("distributed", reason="Dask is the optional extra specviz[cluster]")

from specviz.sweep import GridSpec, LocalExecutor, build_grid, load_dataset, read_results, run_sweep  # noqa: E402
from specviz.sweep.dask_executor import DaskExecutor  # noqa: E402

COMPARED = [
    "tokens",
    "turn_lengths",
    "n_generated",
    "rounds",
    "drafted",
    "accepted",
    "prompt_tokens",
    "seed",
    "turns",
    "category",
    "finish",
]


@pytest.fixture(scope="module")
def client():
    """A LocalCluster of two single-threaded worker processes (its nannies restart a killed worker)."""
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.CRITICAL
    )
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def by_key(df):
    return df.set_index(["question_id", "setting_key", "repeat"]).sort_index()


@pytest.mark.slow
def test_local_cluster_results_equal_the_local_run(tiny_model_path, tmp_path, client):
    qs = tmp_path / "q.jsonl"
    qs.write_text(
        "\n".join(
            json.dumps(q)
            for q in [
                {"question_id": 1, "category": "writing", "turns": ["Once upon a time, in a village", "And then the"]},
                {"question_id": 2, "category": "code", "turns": ["def add(a, b): return a + b\ndef add(a, b):"]},
                {"question_id": 3, "category": "math", "turns": ["1, 2, 3, 4, 5, 6, 7, 8,"]},
            ]
        )
        + "\n"
    )
    grid = build_grid(
        GridSpec(
            strategies=["prompt-lookup", "ngram-simple"],
            knobs={"draft_max": [2, 6]},
            temperatures=[0, 0.8],
            max_tokens=40,
        )
    )
    ds = load_dataset(str(qs))
    local = run_sweep(
        ds,
        grid,
        tmp_path / "local.parquet",
        model=tiny_model_path,
        executor=LocalExecutor(2),
        threads=1,
        progress=False,
    )
    dask = run_sweep(
        ds,
        grid,
        tmp_path / "dask.parquet",
        model=tiny_model_path,
        executor=DaskExecutor(client),
        threads=1,
        progress=False,
    )
    assert local.complete and dask.complete and not dask.failures
    a, b = by_key(read_results(tmp_path / "local.parquet")), by_key(read_results(tmp_path / "dask.parquet"))
    assert len(a) == len(b) == 3 * 10 and list(a.index) == list(b.index)
    for col in COMPARED:  # token outputs and counts, not timings
        assert [json.dumps(x.tolist() if hasattr(x, "tolist") else x) for x in a[col]] == [
            json.dumps(x.tolist() if hasattr(x, "tolist") else x) for x in b[col]
        ], col
    workers = client.run(os.getpid)
    assert {w.split(":")[1] for w in b["worker"]} <= {str(p) for p in workers.values()}  # ran on the cluster
    assert set(dask.model_loads.values()) == {1}  # one model load per worker process, whatever it ran


@pytest.mark.slow
def test_a_killed_worker_loses_and_duplicates_nothing(tiny_model_path, tmp_path, client):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Chapter {i}. It was a dark and stormy night" for i in range(5)) + "\n")
    grid = build_grid(GridSpec(strategies=["prompt-lookup"], max_tokens=500))
    ds = load_dataset(str(prompts))
    killed: dict[str, object] = {}

    def kill_a_busy_worker(result):
        if killed:
            return
        busy = {addr: keys for addr, keys in client.processing().items() if keys}
        if not busy:
            return
        addr, keys = next(iter(busy.items()))
        pid = client.run(os.getpid, workers=[addr])[addr]
        os.kill(pid, signal.SIGKILL)  # a worker process of this test's cluster, mid-task
        killed.update(pid=pid, key=keys[0])

    out = tmp_path / "dask.parquet"
    summary = run_sweep(
        ds,
        grid,
        out,
        model=tiny_model_path,
        executor=DaskExecutor(client),
        threads=1,
        progress=False,
        on_result=kill_a_busy_worker,
    )
    assert killed, "no worker was busy when a result came in"
    assert summary.complete and not summary.failures
    df = read_results(out)
    assert len(df) == 10 and not df.duplicated(["question_id", "setting_key", "repeat"]).any()
    # the task that was running on the killed worker ran again on another process
    index = int(str(killed["key"]).rsplit("-", 1)[1])
    qid = ds.prompts[index].id
    assert not df[df["question_id"] == qid]["worker"].str.endswith(f":{killed['pid']}").any()
    # and its results are those of a clean local run
    ref = tmp_path / "local.parquet"
    run_sweep(ds, grid, ref, model=tiny_model_path, executor=LocalExecutor(2), threads=1, progress=False)
    a, b = by_key(read_results(ref)), by_key(df)
    assert [list(t) for t in a["tokens"]] == [list(t) for t in b["tokens"]]


@pytest.mark.slow
def test_an_existing_scheduler_by_address(tiny_model_path, tmp_path, client, capsys):
    from specviz.cli import main as cli

    out = tmp_path / "r.parquet"
    code = cli.main(
        [
            "sweep",
            "free",
            "-o",
            str(out),
            "--model",
            str(tiny_model_path),
            "--strategy",
            "prompt-lookup",
            "--max-tokens",
            "16",
            "--scheduler",
            client.scheduler.address,
            "--threads",
            "1",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"on Dask at {client.scheduler.address}" in err and "8 of 8 runs stored" in err
    pids = {str(p) for p in client.run(os.getpid).values()}
    assert {w.split(":")[1] for w in read_results(out)["worker"]} <= pids


@pytest.mark.slow
def test_an_unreachable_scheduler_is_a_clear_error():
    from specviz.sweep.dask_executor import ClusterError
    from specviz.testing.page_harness import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(ClusterError, match=f"cannot reach the Dask scheduler at {address}"):
        DaskExecutor(scheduler=address, connect_timeout=1)
