"""Processes at once: several engines of one node sharing Triton's cache and the node-lock directory, each with
worker processes; and a child forked while the parent's builds run."""

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import buildops
from buildops import BuildConfig, BuildState, DynamicSpec, build_pass, lists_kernels, rehearsal, report
from buildops._core.default import current_builder

from conftest import WAIT

HERE = Path(__file__).resolve().parent
VARIANTS = 12  # tests/triton_kernels.py's MATMUL_VARIANTS
RANKS = 5


def test_ranks_with_worker_processes_compile_each_variant_once_on_the_node_and_load_the_same_binaries(tmp_path):
    # tests/test_node.py has three ranks that compile in their own threads; here each rank's builds go to its
    # worker processes, so a claim is taken in one process and the compile runs in another.
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"), "BUILDOPS_NODE_LOCKS": str(tmp_path / "locks"),
           "BUILDOPS_EXECUTOR": "processes", "BUILDOPS_THREADS": "2",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    ranks = [subprocess.Popen([sys.executable, str(HERE / "processes_child.py")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(RANKS)]
    summaries = []
    for rank in ranks:
        out, err = rank.communicate(timeout=600)
        assert rank.returncode == 0, err[-3000:]
        summaries.append(json.loads(out.splitlines()[-1]))
    for summary in summaries:
        print({k: v for k, v in summary.items() if k != "digests"})
    assert sum(s["compiled"] for s in summaries) == VARIANTS  # the node compiled each variant once ...
    assert all(s["compiled"] + s["cached"] == VARIANTS for s in summaries)  # ... each rank has every one built ...
    assert all((s["built"], s["failed"], s["late"]) == (VARIANTS, 0, 0) for s in summaries)  # ... none compiled late
    digests = {tuple(s["digests"]) for s in summaries}
    assert len(digests) == 1 and len(set(*digests)) == VARIANTS  # every rank loaded the same binary per variant


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_builds_run_has_a_working_first_pass_and_the_parents_builds_finish(runs):
    parent, gate = os.getpid(), threading.Event()

    @lists_kernels(BuildConfig(DynamicSpec("x", 0, sweep="exact")), output="x", name="op")
    def op(x):
        return x

    def lister(x):
        # The parent's builds wait on the gate, so they are running and queued at the fork. The child's do not, and
        # are unshared: a key that the parent is building would wait, by design, for the parent's node claim.
        if os.getpid() == parent:
            return [runs.build("op", ("op", x.shape[1]), gate=gate)]
        return [dataclasses.replace(runs.build("op", ("op", x.shape[1])), shared=False)]

    op.lister(lister)
    with rehearsal("startup"):  # leaves its builds in flight
        for width in (1, 2, 3):
            op(torch.empty(4, width))
    assert runs.started.wait(WAIT) and op._self_op.pending.futures
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's builds are not its own, and it builds its own
        try:
            began = time.monotonic()
            op(torch.ones(4, 1))  # the parent's build of this shape never finishes here: the call must not wait
            prompt = time.monotonic() - began < WAIT / 2
            with build_pass("warmup"):  # its first pass: lists every signature again and waits for its own builds
                for width in (1, 2, 3, 4):
                    op(torch.empty(4, width))
            (stats,) = report().ops
            outcome = json.dumps({"prompt": prompt, "built": stats.built, "pending": stats.pending,
                                  "settled": not op._self_op.pending.futures, "joined": buildops.join(timeout=WAIT)})
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            outcome = repr(error)
        finally:
            os.write(write, outcome.encode()[:1000])
            os._exit(0)
    os.close(write)
    try:
        answered = select.select([read], [], [], 3 * WAIT)[0]  # the child writes once, when done or failed
        got = os.read(read, 1000).decode() if answered else "the child never answered"
        assert got.startswith("{"), got
        assert json.loads(got) == {"prompt": True, "built": 4, "pending": 0, "settled": True, "joined": True}, got
    finally:
        gate.set()
        deadline = time.monotonic() + WAIT
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.05)
        os.close(read)
    assert buildops.join(timeout=WAIT)
    builder = current_builder()
    assert [builder.state(("op", width)) for width in (1, 2, 3)] == [BuildState.BUILT] * 3
    assert sorted(runs.calls) == [("op", 1), ("op", 2), ("op", 3)]  # in the parent, each once
