"""Tensor-parallel ranks of one node, on CPUs (issue: two GPUs of one host): each rank a process in a
torch.distributed group (gloo), each with its own build pass. Each kernel is compiled once on the node, whichever
rank gets to it; every rank has every one; an all-reduce between two ops, while one rank's builds are still in
flight, neither deadlocks nor times out; nothing compiles late. With a shared build store, a second node's ranks
fetch every kernel and compile none. The two-GPU run (NCCL, tunings, timings) is benchmarks/tensor_parallel.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

TESTS = Path(__file__).resolve().parent
RANKS, VARIANTS = 2, 12


def start_node(tmp_path, node, store=None):
    """The node's ranks, started together; rank 1 begins its pass a second late."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / node / "triton"),
           "BUILDOPS_NODE_LOCKS": str(tmp_path / node / "locks"), "BUILDOPS_THREADS": "2",
           "BUILDOPS_EXECUTOR": "threads",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    if store is not None:
        env["BUILDOPS_STORE"] = store
    rendezvous = f"file://{tmp_path / node / 'rendezvous'}"
    (tmp_path / node).mkdir()
    return [subprocess.Popen([sys.executable, str(TESTS / "tp_rank.py"), str(rank), str(RANKS), rendezvous,
                              str(float(rank))], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for rank in range(RANKS)]


def summaries(ranks):
    found = []
    for rank in ranks:
        out, err = rank.communicate(timeout=600)
        assert rank.returncode == 0, err[-3000:]
        found.append(json.loads(out.splitlines()[-1]))
    return found


def expected_result():
    # column_parallel doubles each rank's x (rank + 1), the all-reduce sums them, row_parallel adds 1 on each rank,
    # and the second all-reduce sums those
    total = sum(2 * (rank + 1) for rank in range(RANKS))
    return [[float(RANKS * (total + 1))] * 8] * 4


def test_ranks_compile_each_kernel_once_and_meet_in_collectives_while_builds_run(tmp_path):
    ranks = summaries(start_node(tmp_path, "node"))
    assert sum(r["compiled"] for r in ranks) == VARIANTS  # the node compiled each kernel once ...
    assert all(r["compiled"] + r["cached"] == VARIANTS for r in ranks)  # ... and every rank has every one
    assert all((r["built"], r["failed"], r["late"]) == (VARIANTS, 0, 0) for r in ranks)
    assert all(r["result"] == expected_result() for r in ranks)  # the collectives ran, in order, on every rank
    assert ranks[0]["entered"] < ranks[1]["builds_done"]  # rank 0 was in the collective while rank 1's builds ran


def test_a_second_nodes_ranks_fetch_every_kernel_from_the_store(tmp_path):
    (tmp_path / "store").mkdir()
    store = f"file://{tmp_path / 'store'}"
    first = summaries(start_node(tmp_path, "first", store))
    assert sum(r["compiled"] for r in first) == VARIANTS
    second = summaries(start_node(tmp_path, "second", store))
    assert sum(r["compiled"] for r in second) == 0  # the second node compiled nothing ...
    assert sum(r["fetched"] for r in second) == VARIANTS  # ... each kernel fetched once on the node
    assert all(r["late"] == 0 and r["result"] == expected_result() for r in first + second)
