"""Builds shared through the build store: N simulated nodes on one machine, one Redis on loopback.

Each node is a fresh process with its own Triton cache (``TRITON_CACHE_DIR``) and node-lock directory, running one
build pass of a workload: ``fla_lm`` (examples/fla_lm, fla-core's kernels; on a machine without a GPU they compile
for sm_90 through the compile-only driver) or ``tiny_llm`` (examples/tiny_llm's small model, quicker). The runs:

    lone     one node, empty cache, no store: its CPU less the warm node's is the build CPU the cluster shares
    warm     one node on the lone node's cache, no store: its pass time, and its CPU as the baseline of what is
             not building (imports, listing)
    warm xN  N nodes at once on copies of that cache, no store: the pass time of N nodes that build nothing,
             which the cores' contention alone gives
    wave 1   N nodes at once, empty caches, an empty store
    wave 2   N fresh nodes at once, empty caches, the store wave 1 left

A node's CPU is its process tree's: the node, what it reaped (``os.wait4``), and its live descendants at the end of
its pass (``/proc``: worker processes a forkserver started are not the node's children); its build CPU is that
less the warm node's. Every node imports first and begins its pass when all of a run's nodes have imported
(one gate), so the passes overlap. Each node has ``BUILDOPS_THREADS`` = max(1, cores // N) builder threads. The
goals: wave 1 compiles each kernel once across the cluster, each wave-1 node spends about 1/N of the lone node's
build CPU, wave 2 compiles nothing and its pass takes at most 1.2x the warm node's.

    python benchmarks/cluster.py [--nodes 4] [--workload fla_lm|tiny_llm] [--rounds 1] [--json out.json]
                                 [--store redis|directory]

Run from the repository root; with the default store, ``redis-server`` and the ``redis`` client must be
installed. The nodes see no GPU (``CUDA_VISIBLE_DEVICES=""``). With ``--rounds R`` the
whole sequence runs R times and the table shows medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYCACHE = Path(tempfile.gettempdir()) / "buildops-cluster-pycache"  # bytecode primed once, outside the checkout


def node(workload: str) -> None:
    """One node: set up the workload, wait at the gate, run the build pass, print one JSON line."""
    import torch

    import buildops
    from buildops._core.default import default_builder

    if workload == "fla_lm":
        import warnings

        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")  # fla, on a CPU
        from examples.fla_lm.model import Config, Model

        torch.manual_seed(0)
        model = Model(Config()).to(dtype=torch.bfloat16)
        ids = torch.zeros(256, dtype=torch.long)  # the example's dummy forward: 256 tokens

        def forward() -> None:
            model(ids)
    else:
        from examples.tiny_llm.model import SIZES, TinyLlm

        model = TinyLlm(SIZES["small"], "cpu")
        model.dummy_weights()
        forward = model.rehearse
    print("ready", flush=True)
    sys.stdin.readline()  # the gate
    began = time.perf_counter()
    with torch.no_grad(), buildops.build_pass("cluster"):
        forward()
    pass_s = time.perf_counter() - began
    coverage = buildops.report().coverage().values()
    counts = default_builder().store_counts()
    cpu_s = tree_cpu_seconds()  # before the shutdown: worker processes a forkserver started are not our children
    buildops.shutdown()
    print(json.dumps({"pass_s": pass_s, "cpu_s": cpu_s, "compiled": sum(c.compiled for c in coverage),
                      "cached": sum(c.cached for c in coverage), "prebuilt": sum(c.prebuilt for c in coverage),
                      "late": sum(c.late for c in coverage),
                      "store": None if counts is None else dataclasses.asdict(counts)}), flush=True)


def tree_cpu_seconds() -> float:
    """CPU seconds of this process, the children it reaped, and every live descendant (Linux ``/proc``)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    ticks = os.sysconf("SC_CLK_TCK")
    pending, seen = [os.getpid()], set()
    while pending:
        pid = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            children = {int(c) for t in tasks for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()}
        except OSError:
            continue
        for child in children - seen:
            seen.add(child)
            pending.append(child)
            try:  # utime and stime: fields 14 and 15, counted after the parenthesised command name
                fields = Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()
                total += (int(fields[11]) + int(fields[12])) / ticks
            except (OSError, IndexError, ValueError):
                pass
    return total


def run_nodes(count: int, workload: str, work: Path, env: dict, caches: list[Path] | None = None) -> list[dict]:
    """``count`` nodes at once (fresh caches unless given); each one's JSON with its ``cpu_s`` and ``wall_s``."""
    nodes = []
    for index in range(count):
        name = f"{time.monotonic_ns()}-{index}"
        cache = caches[index] if caches else work / f"cache-{name}"
        path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
        # No GPU for the nodes: what they share is compile work, which compiles for sm_90 without one; on a GPU
        # host, N nodes on one GPU would also contend for it.
        environ = dict(os.environ, PYTHONPATH=path, PYTHONPYCACHEPREFIX=str(PYCACHE), CUDA_VISIBLE_DEVICES="",
                       TRITON_CACHE_DIR=str(cache), BUILDOPS_NODE_LOCKS=str(work / f"locks-{name}"), **env)
        if "BUILDOPS_STORE" not in env:
            environ.pop("BUILDOPS_STORE", None)
        with open(work / f"node-{name}.log", "w") as log:
            process = subprocess.Popen([sys.executable, __file__, "--node", workload], env=environ, cwd=ROOT,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        process.log, process.cache = work / f"node-{name}.log", cache  # type: ignore[attr-defined]
        nodes.append(process)
    for process in nodes:  # every node has imported and set up its model
        if process.stdout.readline().strip() != "ready":
            raise SystemExit(f"a node failed before its pass:\n{process.log.read_text()[-4000:]}")
    began = time.perf_counter()
    for process in nodes:
        process.stdin.write("go\n")
        process.stdin.flush()
    results = []
    for process in nodes:
        out = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)  # rusage of the node and every descendant it reaped
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            raise SystemExit(f"a node failed:\n{process.log.read_text()[-4000:]}")
        result = json.loads(out.strip().splitlines()[-1])
        # The node's own count of its process tree; wait4's misses workers it did not reap itself. The larger.
        result.update(cpu_s=max(result["cpu_s"], usage.ru_utime + usage.ru_stime),
                      wall_s=time.perf_counter() - began, cache=str(process.cache))
        results.append(result)
    return results


class Redis:
    """A redis-server of our own on loopback, no persistence."""

    def __init__(self, work: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        password = secrets.token_hex(8)
        self.process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                         "--appendonly", "no", "--requirepass", password, "--dir", str(work)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://:{password}@127.0.0.1:{port}/0"
        import redis

        self.client = redis.Redis.from_url(self.url)
        for _ in range(100):
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise SystemExit("redis-server did not answer within 5 s")

    def clear(self) -> None:
        self.client.flushdb()

    def stop(self) -> None:
        self.client.close()
        self.process.terminate()
        self.process.wait(timeout=10)


class DirectoryStore:
    """A build store in a directory (``file://``): for hosts without redis-server."""

    def __init__(self, work: Path) -> None:
        self.root = work / "store"
        self.url = f"file://{self.root}"
        self.root.mkdir(exist_ok=True)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir()

    def stop(self) -> None:
        self.clear()


def one_round(nodes: int, workload: str, work: Path, redis: Redis | DirectoryStore, threads: int) -> dict:
    base = {"BUILDOPS_THREADS": str(threads)}
    lone = run_nodes(1, workload, work, base)[0]
    warm = run_nodes(1, workload, work, base, caches=[Path(lone["cache"])])[0]
    copies = [shutil.copytree(lone["cache"], work / f"warm-{time.monotonic_ns()}-{i}") for i in range(nodes)]
    warm_n = run_nodes(nodes, workload, work, base, caches=copies)
    redis.clear()  # a cold store
    store = dict(base, BUILDOPS_STORE=redis.url)
    wave1 = run_nodes(nodes, workload, work, store)
    wave2 = run_nodes(nodes, workload, work, store)
    return {"lone": lone, "warm": warm, "warm_n": warm_n, "wave1": wave1, "wave2": wave2}


def figures(result: dict) -> dict:
    """The goals' figures of one round; per-node lists sorted, so that rounds' medians pair them up."""
    baseline, lone = result["warm"]["cpu_s"], result["lone"]
    lone_build = lone["cpu_s"] - baseline
    return {"distinct": lone["compiled"], "wave1_compiles": sum(n["compiled"] for n in result["wave1"]),
            "lone_build_cpu_s": lone_build, "baseline_cpu_s": baseline,
            "wave1_build_cpu_s": sorted(n["cpu_s"] - baseline for n in result["wave1"]),
            "wave1_pass_s": sorted(n["pass_s"] for n in result["wave1"]), "lone_pass_s": lone["pass_s"],
            "wave2_compiles": sum(n["compiled"] for n in result["wave2"]),
            "wave2_pass_s": sorted(n["pass_s"] for n in result["wave2"]), "warm_pass_s": result["warm"]["pass_s"],
            "warm_n_pass_s": sorted(n["pass_s"] for n in result["warm_n"]),
            "wave2_build_cpu_s": sorted(n["cpu_s"] - baseline for n in result["wave2"])}


def median(rounds: list[dict]) -> dict:
    out = {}
    for name, value in rounds[0].items():
        values = [r[name] for r in rounds]
        out[name] = ([statistics.median(column) for column in zip(*values)] if isinstance(value, list)
                     else statistics.median(values))
    return out


def show_nodes(label: str, nodes: list[dict], baseline: float) -> None:
    for index, n in enumerate(nodes):
        s = n["store"] or {}
        print(f"  {label} node {index}: pass {n['pass_s']:6.2f} s, CPU {n['cpu_s']:6.1f} s (build "
              f"{n['cpu_s'] - baseline:5.1f}), compiled {n['compiled']:3d}, cached {n['cached']:3d}, store: fetched "
              f"{s.get('fetched', '-')}, stored {s.get('stored', '-')}, known locally {s.get('known_locally', '-')}, "
              f"waited for others {s.get('waited_for_others', '-')}, built after others "
              f"{s.get('built_after_others', '-')}, failed {s.get('failed')}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node", choices=("fla_lm", "tiny_llm"), help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--workload", choices=("fla_lm", "tiny_llm"), default="fla_lm")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", help="write the raw figures here")
    parser.add_argument("--store", choices=("redis", "directory"), default="redis",
                        help="the store the nodes share: a redis-server on loopback, or a directory")
    args = parser.parse_args()
    if args.node:
        return node(args.node)
    cores = os.cpu_count() or 1
    threads = max(1, cores // args.nodes)
    print(f"{args.nodes} nodes of {args.workload} on {cores} cores: BUILDOPS_THREADS={threads} per node "
          f"(max(1, cores // nodes)), executor buildops' default, store: {args.store}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="buildops-cluster-"))
    redis = Redis(work) if args.store == "redis" else DirectoryStore(work)
    try:
        run_nodes(1, args.workload, work, {"BUILDOPS_THREADS": str(threads)})  # primes bytecode; not counted
        results, rounds = [], []
        for index in range(args.rounds):
            result = one_round(args.nodes, args.workload, work, redis, threads)
            results.append(result)
            rounds.append(figures(result))
            baseline = result["warm"]["cpu_s"]
            print(f"round {index + 1}: lone pass {result['lone']['pass_s']:.2f} s, CPU {result['lone']['cpu_s']:.1f} s "
                  f"({result['lone']['compiled']} compiled); warm pass {result['warm']['pass_s']:.2f} s, CPU "
                  f"{baseline:.1f} s (the baseline)", flush=True)
            show_nodes("warm x N", result["warm_n"], baseline)
            show_nodes("wave 1", result["wave1"], baseline)
            show_nodes("wave 2", result["wave2"], baseline)
    finally:
        redis.stop()
    m = median(rounds)
    n = args.nodes
    what = f"median of {args.rounds} rounds" if args.rounds > 1 else "one round"
    print(f"\n{n} nodes, {args.workload}, {cores} cores, {threads} builder thread(s) per node; {what}:\n")
    print("| figure | measured | goal |\n| --- | --- | --- |")
    print(f"| wave-1 compiles, all nodes / distinct kernels | {m['wave1_compiles']:.0f} / {m['distinct']:.0f} = "
          f"{m['wave1_compiles'] / max(m['distinct'], 1):.2f}x | 1x |")
    shares = ", ".join(f"{c:.1f} ({c / m['lone_build_cpu_s']:.2f})" for c in m["wave1_build_cpu_s"])
    print(f"| wave-1 build CPU s per node (of the lone node's {m['lone_build_cpu_s']:.1f} s) | {shares} | "
          f"about 1/{n} = {1 / n:.2f} |")
    print(f"| wave-2 compiles | {m['wave2_compiles']:.0f} | 0 |")
    passes = ", ".join(f"{p:.2f} ({p / m['warm_pass_s']:.2f}x)" for p in m["wave2_pass_s"])
    print(f"| wave-2 pass s per node (warm local node {m['warm_pass_s']:.2f} s) | {passes} | at most 1.2x |")
    print(f"| reference: pass s per node, N warm local nodes at once | "
          f"{', '.join(f'{p:.2f}' for p in m['warm_n_pass_s'])} | |")
    if args.json:
        Path(args.json).write_text(json.dumps({"nodes": n, "workload": args.workload, "cores": cores,
                                               "threads": threads, "medians": m, "rounds": results}, indent=1))


if __name__ == "__main__":
    main()
