"""Nodes as processes: each its own Triton cache and node-lock directory, one redis-server between them. Real
Triton compiles (for sm_90 through the compile-only driver where there is no GPU)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from buildops.store import open_store

from conftest import WAIT

CHILD = Path(__file__).with_name("node_child.py")
NODE_TIMEOUT = 240  # a cold node compiles a few kernels; CI machines are slow


def node_env(tmp_path, name, url, **extra):
    root = tmp_path / name
    return {**os.environ, "BUILDOPS_STORE": url, "TRITON_CACHE_DIR": str(root / "triton"),
            "BUILDOPS_NODE_LOCKS": str(root / "locks"), "PYTHONPATH": str(Path(__file__).parents[2]), **extra}


def start_node(tmp_path, name, url, *args, **extra):
    return subprocess.Popen([sys.executable, str(CHILD), *args], env=node_env(tmp_path, name, url, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(node):
    out, err = node.communicate(timeout=NODE_TIMEOUT)
    assert node.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_nodes_that_start_together_compile_each_kernel_once(redis_url, tmp_path):
    nodes = [start_node(tmp_path, f"node{i}", redis_url) for i in range(3)]
    results = [result(node) for node in nodes]
    kernels = {r["compiled"] + r["cached"] for r in results}
    assert len(kernels) == 1 and kernels.pop() > 1, results  # every node ends with every kernel
    distinct = results[0]["compiled"] + results[0]["cached"]
    assert sum(r["compiled"] for r in results) == distinct, results  # each compiled once in the cluster
    assert sum(r["stored"] for r in results) == distinct
    assert all(r["compiled"] + r["fetched"] == distinct for r in results), results
    second_wave = result(start_node(tmp_path, "late", redis_url))
    assert (second_wave["compiled"], second_wave["fetched"]) == (0, distinct)
    store = open_store(redis_url)
    blobs = [store.get(key) for key, _ in store.entries()]
    assert len(blobs) == distinct and not any(str(tmp_path).encode() in blob for blob in blobs), \
        "an artifact names a path of the node that stored it"


def test_a_node_killed_while_it_holds_a_claim_holds_up_others_one_lease(redis_url, tmp_path):
    # The first node stores everything; the key of one of its kernels is then claimed by a node that dies.
    first = result(start_node(tmp_path, "first", redis_url))
    store = open_store(redis_url)
    keys = [k for k, _ in store.entries()]
    assert len(keys) == first["compiled"]
    store.clear()
    lease = 15  # longer than the late node takes to reach the key, so that it finds the claim held
    holder = start_node(tmp_path, "holder", redis_url, "--hold", keys[0], BUILDOPS_STORE_LEASE=str(lease))
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait(WAIT)
    killed = time.monotonic()
    late = result(start_node(tmp_path, "late", redis_url))
    assert late["compiled"] == first["compiled"] and late["waited"] == 1, late  # built once the lease lapsed
    assert time.monotonic() - killed < lease + NODE_TIMEOUT


def test_a_node_refused_by_the_store_builds_everything_itself(redis_server, tmp_path):
    password = "not-the-password-4811"
    url = f"redis://:{password}@127.0.0.1:{redis_server.port}/0"
    node = start_node(tmp_path, "node", url)
    out, err = node.communicate(timeout=NODE_TIMEOUT)
    assert node.returncode == 0, err[-3000:]
    counts = json.loads(out.strip().splitlines()[-1])
    assert counts["compiled"] > 1 and counts["fetched"] == counts["stored"] == 0
    assert err.count("without the store") == 1 and password not in err
