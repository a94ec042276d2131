"""The tiny LLM's first request against its steady state, without and with a warm request, in one run.

    python3 benchmarks/first_request.py [--starts 5] [--profile] [--arms before,after] [--json PATH]

Each round starts examples/tiny_llm as ``benchmarks/startup.py``'s (c) and (d) do, once per arm: (c) a buildops
start on an empty Triton cache, (d) a restart on the cache it left. The arms take turns start by start, in an
order that alternates from round to round. Every start is a fresh process that reads the checkpoint from disk and
serves what the example serves: 4 requests, then the first one 5 times more, whose median is the steady state.

    before  the example's --no-warm-request: the start ends once the builds serving needs are done
    after   the example's --warm-request (its default): the start then ends with one short real request
            (rehearse_then_load's warm)

Each start runs the example's own main in a child (this script with --child), which times every request and
records around the first one and a steady one: the main thread's CPU time against the process's (other threads),
the builds still pending and the time spent waiting for them, the caching allocator's counters, modules imported,
the host's busy CPU. The final table gives
medians per start and arm over the rounds.

``--profile``: after the first round, a restart of each ``--profile-arms`` arm on that round's cache (not in the
table) records its first request and a steady one with torch.profiler (CPU and CUDA) and cProfile, and prints what
the first spent beyond the steady one: CPU ops, Python functions, CUDA runtime and driver calls, GPU kernel time.

Run from the repository root on the GPU host (the checkpoint is made first where it is missing). On a CPU machine,
``--size small --no-prime --example-args='--device cpu --new-tokens 2'`` with ``TRITON_INTERPRET=1`` runs every
step with Triton's interpreter, for a dry run.
"""

from __future__ import annotations

import time

LAUNCHED = time.perf_counter()  # a child's launch, before its imports: the example's clock starts here

import argparse  # noqa: E402
import cProfile  # noqa: E402
import ctypes  # noqa: E402
import functools  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# arm -> the example's flags: both named, so that an arm stays what it is whatever the example's default
ARMS: dict[str, tuple[str, ...]] = {"before": ("--no-warm-request",), "after": ("--warm-request",)}
# The caching allocator's counters compared over a request (those this torch has)
MEMORY_KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams",
               "segment.all.allocated", "reserved_bytes.all.current")
# CUDA calls always shown in a profile's diff where either request made them
NOTABLE_CALLS = ("cudaMalloc", "cudaFree", "cudaHostAlloc", "cuMemAlloc", "cuModuleLoad", "cuModuleLoadData",
                 "cuLibraryLoadData", "cuModuleGetFunction", "cublasCreate", "cudaStreamCreate",
                 "cudaStreamCreateWithPriority", "cudaEventCreate", "cudaEventCreateWithFlags",
                 "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaFuncGetAttributes")
# Kineto's trace categories, old and new spellings, by what the diff calls them
TRACE_KINDS = {"cpu_op": "cpu_op", "operator": "cpu_op", "cuda_runtime": "runtime", "runtime": "runtime",
               "cuda_driver": "driver", "driver": "driver", "kernel": "kernel", "gpu_memcpy": "memcpy",
               "memcpy": "memcpy", "gpu_memset": "memset", "memset": "memset"}


# -- the child: the example's own main, with its requests timed ----------------------------------------------

class Recorder:
    """Times the example's requests (its model's ``generate`` once the start is ready: the example calls
    ``count_compiles`` just before its first request, and a warm request before that is not one) and records what
    may tell the first from a steady one around both; with a profile directory, profiles both."""

    def __init__(self, requests: int, profile_dir: Path | None) -> None:
        self.requests = requests  # the example's distinct requests; the calls after them repeat the first
        self.steady_index = requests + 1  # the second repeat: the one recorded (and profiled) as steady
        self.profile_dir = profile_dir
        self.armed = False
        self.walls: list[float] = []
        self.cpus: list[float] = []
        self.process_cpus: list[float] = []
        self.forwards: list[list[float]] = []  # per request, each forward's host time (its launches; no sync)
        self.around: dict[str, dict[str, Any]] = {}

    def arm(self, count_compiles: Any) -> Any:
        @functools.wraps(count_compiles)
        def armed(*args: Any, **kwargs: Any) -> Any:
            self.armed = True
            return count_compiles(*args, **kwargs)
        return armed

    def wrap(self, generate: Any) -> Any:
        @functools.wraps(generate)
        def timed(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
            if not self.armed:  # the start's warm request
                return generate(model, prompt, new_tokens)
            return self._call(generate, model, prompt, new_tokens)
        return timed

    def wrap_forward(self, forward: Any) -> Any:
        @functools.wraps(forward)
        def timed(model: Any, ids: Any, start: int) -> Any:
            if not self.armed or len(self.forwards) <= len(self.walls):  # outside a request being timed
                return forward(model, ids, start)
            began = time.perf_counter()
            try:
                return forward(model, ids, start)
            finally:
                self.forwards[-1].append(time.perf_counter() - began)
        return timed

    def _call(self, generate: Any, model: Any, prompt: list[int], new_tokens: int) -> list[int]:
        index = len(self.walls)
        label = "first" if index == 0 else "steady" if index == self.steady_index else None
        before = self._state() if label else None  # outside the time taken
        profiling = self._start_profiling(first=index == 0) if label and self.profile_dir else None
        modules = set(sys.modules) if label else set()  # the profiler's own imports are not the request's
        self.forwards.append([])
        wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
        try:
            return generate(model, prompt, new_tokens)
        finally:
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            process = time.process_time() - process
            imported = sorted(set(sys.modules) - modules) if label else []
            self.walls.append(wall)
            self.cpus.append(cpu)
            self.process_cpus.append(process)
            if profiling is not None and label is not None:
                self._stop_profiling(profiling, label)
            if before is not None and label is not None:
                self.around[label] = {**compare_states(before, self._state(), wall, cpu, process),
                                      "imported": imported}

    def _state(self) -> dict[str, Any]:
        import torch

        import buildops
        from buildops import BuildState

        report = buildops.report()
        ends = [b.started + b.seconds for b in report.builds
                if b.started is not None and b.state not in (BuildState.QUEUED, BuildState.BUILDING)]
        memory = torch.cuda.memory_stats() if torch.cuda.is_available() else {}
        return {
            "at": time.perf_counter(),
            "pending_builds": int(report.total("pending")),
            "build_wait_s": float(report.total("wait_seconds")),
            "last_build_end": max(ends) if ends else None,
            "threads": sorted(t.name for t in threading.enumerate()),
            "host_cpu": host_cpu(),
            "memory": {key: memory[key] for key in MEMORY_KEYS if key in memory},
        }

    def _start_profiling(self, first: bool) -> tuple[Any, cProfile.Profile]:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        if first:  # the profiler's own first start (CUPTI's) in a session of its own, not in the first request's
            with profile(activities=activities):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
        profiler = profile(activities=activities, record_shapes=False)
        python = cProfile.Profile()
        profiler.start()
        python.enable()
        return profiler, python

    def _stop_profiling(self, profiling: tuple[Any, cProfile.Profile], label: str) -> None:
        profiler, python = profiling
        python.disable()
        profiler.stop()
        assert self.profile_dir is not None  # only profiling with one
        profiler.export_chrome_trace(str(self.profile_dir / f"{label}.trace.json"))
        python.dump_stats(str(self.profile_dir / f"{label}.pstats"))

    def result(self) -> dict[str, Any]:
        import torch
        import triton

        versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
                    "module_loading": loading_mode()}
        return {"versions": versions, "requests": self.requests, "steady_index": self.steady_index, "walls": self.walls,
                "cpus": self.cpus, "process_cpus": self.process_cpus, "forwards": self.forwards,
                "around": self.around, "profiled": self.profile_dir is not None}


def compare_states(before: dict[str, Any], after: dict[str, Any], wall: float, cpu: float,
                   process: float) -> dict[str, Any]:
    """What a request changed, from the states before and after it, as JSON-able data."""
    host = None
    if before["host_cpu"] is not None and after["host_cpu"] is not None:
        host = (after["host_cpu"] - before["host_cpu"]) / os.sysconf("SC_CLK_TCK")
    last = before["last_build_end"]
    return {
        "wall_s": wall, "main_thread_cpu_s": cpu, "process_cpu_s": process,
        "host_busy_cpu_s": host,  # every process of the host (a whole machine's /proc/stat), this one included
        "pending_builds": before["pending_builds"], "pending_builds_after": after["pending_builds"],
        "build_wait_s": after["build_wait_s"] - before["build_wait_s"],
        "since_last_build_s": None if last is None else before["at"] - last,
        "threads": before["threads"],
        "memory": {key: after["memory"][key] - before["memory"].get(key, 0) for key in after["memory"]},
    }


def loading_mode() -> str | None:
    """CUDA's module loading mode in this process (``cuModuleGetLoadingMode``), or None where it cannot say."""
    try:
        mode = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuModuleGetLoadingMode(ctypes.byref(mode)) != 0:
            return None
    except (OSError, AttributeError):  # no NVIDIA driver here
        return None
    return {1: "eager", 2: "lazy"}.get(mode.value, str(mode.value))


def host_cpu() -> int | None:
    """Busy CPU time of the whole host so far, in clock ticks (/proc/stat), or None where there is none."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields[:8]) - fields[3] - fields[4]  # user..steal, less idle and iowait


def child(argv: list[str]) -> None:
    """Run the example's main as ``python -m examples.tiny_llm`` would (a buildops start), its requests timed."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--profile-dir")
    parser.add_argument("--json", required=True)
    own, example_args = parser.parse_known_args(argv)
    from buildops.startup import start_build_workers

    start_build_workers()  # before torch is imported, as the example's own main does for a buildops start
    import examples.tiny_llm.__main__ as example
    from examples.tiny_llm import kernels

    if os.environ.get("TRITON_INTERPRET") == "1":  # a dry run: nothing to time in the interpreter
        kernels._matmul_kernel.do_bench = lambda fn, quantiles: (fn(), [1.0, 1.0, 1.0])[1]
    example.LAUNCHED = LAUNCHED
    profile_dir = Path(own.profile_dir) if own.profile_dir else None
    recorder = Recorder(len(example.PROMPT_LENGTHS), profile_dir)
    example.TinyLlm.generate = recorder.wrap(example.TinyLlm.generate)
    example.TinyLlm.forward = recorder.wrap_forward(example.TinyLlm.forward)
    example.count_compiles = recorder.arm(example.count_compiles)
    sys.argv = ["examples.tiny_llm", *example_args, "--json", own.json]
    example.main()
    result = json.loads(Path(own.json).read_text())
    result["first_request"] = recorder.result()
    Path(own.json).write_text(json.dumps(result))


# -- reading a start's results -------------------------------------------------------------------------------

def start_row(result: dict[str, Any]) -> dict[str, Any]:
    """One start's figures: the first request, the steady median (the example's definition, less a profiled
    request), their ratio, and what was recorded around the first request."""
    record = result["first_request"]
    walls, cpus, first_index = record["walls"], record["cpus"], 0
    steady = [i for i in range(record["requests"], len(walls))
              if not (record["profiled"] and i == record["steady_index"])]
    median = sorted(steady, key=lambda i: walls[i])[len(steady) // 2]
    around = record["around"].get("first", {})
    forwards = record["forwards"]
    return {
        "ready_s": result["ready_s"], "first_ms": walls[first_index] * 1e3, "steady_ms": walls[median] * 1e3,
        "ratio": walls[first_index] / walls[median], "extra_ms": (walls[first_index] - walls[median]) * 1e3,
        # the control: the slowest repeat of one request against the same median (the host's swing, no first use)
        "repeat_ratio": max(walls[i] for i in steady) / walls[median],
        # the extra in the context forward's host time, and in the decode steps' (their launches, no waits)
        "extra_context_ms": (forwards[first_index][0] - forwards[median][0]) * 1e3,
        "extra_decode_ms": (sum(forwards[first_index][1:]) - sum(forwards[median][1:])) * 1e3,
        "first_cpu_ms": cpus[first_index] * 1e3, "steady_cpu_ms": statistics.median(cpus[i] for i in steady) * 1e3,
        "other_threads_cpu_ms": (around.get("process_cpu_s", 0.0) - around.get("main_thread_cpu_s", 0.0)) * 1e3,
        "pending_builds": around.get("pending_builds", 0), "build_wait_ms": around.get("build_wait_s", 0.0) * 1e3,
        "device_allocs": around.get("memory", {}).get("num_device_alloc", 0),
        "imported": len(around.get("imported", [])), "tokens": result["tokens"],
        "requests_ms": [w * 1e3 for w in walls],
    }


def describe_start(label: str, row: dict[str, Any]) -> str:
    return (f"{label}: ready {row['ready_s']:.2f} s; first {row['first_ms']:.1f} ms, steady {row['steady_ms']:.1f} ms "
            f"({row['ratio']:.2f}x); main thread CPU {row['first_cpu_ms']:.0f}/{row['steady_cpu_ms']:.0f} ms; "
            f"{row['pending_builds']} build(s) pending")


TABLE = (("first ms", "first_ms", "{:8.1f}"), ("steady ms", "steady_ms", "{:9.1f}"), ("ratio", "ratio", "{:5.2f}"),
         ("repeat ratio", "repeat_ratio", "{:12.2f}"),
         ("extra ms", "extra_ms", "{:8.1f}"), ("in context", "extra_context_ms", "{:10.1f}"),
         ("in decode", "extra_decode_ms", "{:9.1f}"), ("first CPU ms", "first_cpu_ms", "{:12.1f}"),
         ("steady CPU ms", "steady_cpu_ms", "{:13.1f}"),
         ("pending", "pending_builds", "{:7.0f}"), ("ready s", "ready_s", "{:7.2f}"))


def medians(rows: list[dict[str, Any]], arms: list[str]) -> list[dict[str, Any]]:
    """Per start and arm, the median of each figure over the rounds, and the worst ratio."""
    table = []
    for kind in ("(c)", "(d)"):
        for arm in arms:
            chosen = [r for r in rows if r["start"] == kind and r["arm"] == arm]
            if chosen:
                line = {"start": kind, "arm": arm, "n": len(chosen),
                        "worst_ratio": max(r["ratio"] for r in chosen),
                        "worst_repeat": max(r["repeat_ratio"] for r in chosen)}
                line.update({key: statistics.median(r[key] for r in chosen) for _, key, _ in TABLE})
                table.append(line)
    return table


def format_table(table: list[dict[str, Any]]) -> str:
    head = f"{'start':5} {'arm':7} {'n':>2} " + " ".join(title for title, _, _ in TABLE) + "  worst ratio  worst repeat"
    lines = [head]
    for line in table:
        cells = " ".join(fmt.format(line[key]).rjust(len(title)) for title, key, fmt in TABLE)
        lines.append(f"{line['start']:5} {line['arm']:7} {line['n']:2d} {cells}  {line['worst_ratio']:11.2f}"
                     f"  {line['worst_repeat']:12.2f}")
    return "\n".join(lines)


# -- a profile's diff ----------------------------------------------------------------------------------------

SLOW_CALL_MS = 0.5  # a CUDA call this long is counted apart: a lazy load, an allocation, a wait


def summarize_trace(path: Path) -> dict[str, dict[str, list[float]]]:
    """A Kineto chrome trace by kind (cpu_op, runtime, driver, kernel, memcpy, memset) and name:
    [calls, total ms, longest ms, calls of SLOW_CALL_MS or more]."""
    with open(path) as file:
        events = json.load(file).get("traceEvents", [])
    out: dict[str, dict[str, list[float]]] = {}
    for event in events:
        if event.get("ph") != "X":
            continue
        kind = TRACE_KINDS.get(str(event.get("cat", "")).lower())
        if kind is None:
            continue
        ms = float(event.get("dur", 0)) / 1e3
        row = out.setdefault(kind, {}).setdefault(str(event.get("name", "?")), [0, 0.0, 0.0, 0])
        row[0] += 1
        row[1] += ms
        row[2] = max(row[2], ms)
        row[3] += ms >= SLOW_CALL_MS
    return out


def _totals(summary: dict[str, dict[str, list[float]]], kind: str) -> tuple[int, float]:
    rows = summary.get(kind, {}).values()
    return int(sum(r[0] for r in rows)), sum(r[1] for r in rows)


def _function_name(key: tuple) -> str:
    filename, line, name = key
    if filename == "~":  # a builtin
        return name
    return f"{Path(filename).name}:{line}({name})"


def python_diff(first: Path, steady: Path, top: int) -> dict[str, list[tuple]]:
    """cProfile's functions whose self time, and whose cumulative time, the first request exceeds the steady one
    by the most: (name, ms more, calls first, calls steady, ms first)."""
    stats_first = pstats.Stats(str(first)).stats  # type: ignore[attr-defined]  # pstats keeps them there
    stats_steady = pstats.Stats(str(steady)).stats  # type: ignore[attr-defined]
    rows = []
    for key, (_cc, calls, own, cumulative, _callers) in stats_first.items():
        _, steady_calls, steady_own, steady_cumulative, _ = stats_steady.get(key, (0, 0, 0.0, 0.0, {}))
        rows.append((_function_name(key), (own - steady_own) * 1e3, (cumulative - steady_cumulative) * 1e3, calls,
                     steady_calls, own * 1e3, cumulative * 1e3))
    by_own = sorted(rows, key=lambda r: -r[1])[:top]
    by_cumulative = sorted(rows, key=lambda r: -r[2])[:top]
    return {"self": [(r[0], r[1], r[3], r[4], r[5]) for r in by_own],
            "cumulative": [(r[0], r[2], r[3], r[4], r[6]) for r in by_cumulative]}


def profile_diff(directory: Path, record: dict[str, Any], top: int = 15) -> tuple[list[str], dict[str, Any]]:
    """The text lines that compare a profiled start's first request with its steady one, and the same as data."""
    first, steady = summarize_trace(directory / "first.trace.json"), summarize_trace(directory / "steady.trace.json")
    around = record["around"]
    lines = []
    walls = record["walls"]
    steady_ms = walls[record["steady_index"]] * 1e3
    lines.append(f"first request {walls[0] * 1e3:.1f} ms against the steady one's {steady_ms:.1f}"
                 f" ms, both profiled (main thread CPU {around['first']['main_thread_cpu_s'] * 1e3:.1f} / "
                 f"{around['steady']['main_thread_cpu_s'] * 1e3:.1f} ms, other threads "
                 f"{(around['first']['process_cpu_s'] - around['first']['main_thread_cpu_s']) * 1e3:.1f} / "
                 f"{(around['steady']['process_cpu_s'] - around['steady']['main_thread_cpu_s']) * 1e3:.1f} ms)")
    forwards, steady_forwards = record["forwards"][0], record["forwards"][record["steady_index"]]
    lines.append(f"forwards' host time (launches; ms, first / steady): context {forwards[0] * 1e3:.1f} / "
                 f"{steady_forwards[0] * 1e3:.1f}, decode steps {sum(forwards[1:]) * 1e3:.1f} / "
                 f"{sum(steady_forwards[1:]) * 1e3:.1f} (longest {max(forwards[1:], default=0) * 1e3:.1f} / "
                 f"{max(steady_forwards[1:], default=0) * 1e3:.1f}); the rest of each request (sampling, and "
                 f"waiting for the GPU) {(walls[0] - sum(forwards)) * 1e3:.1f} / "
                 f"{(walls[record['steady_index']] - sum(steady_forwards)) * 1e3:.1f}")
    for kind, what in (("kernel", "GPU kernels"), ("memcpy", "copies"), ("memset", "memsets")):
        (n_first, ms_first), (n_steady, ms_steady) = _totals(first, kind), _totals(steady, kind)
        if n_first or n_steady:
            lines.append(f"{what} on the GPU (first / steady): {ms_first:.1f} ms in {n_first} / {ms_steady:.1f} ms "
                         f"in {n_steady}")

    ops = first.get("cpu_op", {})
    steady_ops = steady.get("cpu_op", {})
    op_rows = sorted(((name, row[1] - steady_ops.get(name, [0, 0.0, 0.0])[1], row, steady_ops.get(name))
                      for name, row in ops.items()), key=lambda r: -r[1])
    op_rows = [r for r in op_rows if r[1] > 0][:top]
    lines.append("CPU ops, time beyond the steady request's (inclusive ms: first, steady; calls):")
    for name, beyond, row, other in op_rows:
        other = other or [0, 0.0, 0.0]
        lines.append(f"  {beyond:8.2f} more  {row[1]:8.2f} {other[1]:8.2f}  {int(row[0]):6d} {int(other[0]):6d}  "
                     f"{name[:70]}")

    calls = {**steady.get("runtime", {}), **steady.get("driver", {})}
    first_calls = {**first.get("runtime", {}), **first.get("driver", {})}
    names = set(first_calls) | set(calls)
    none = [0, 0.0, 0.0, 0]

    def more(name: str) -> float:
        return first_calls.get(name, none)[1] - calls.get(name, none)[1]

    shown = sorted((n for n in names if more(n) > 0.01 or any(n.startswith(c) for c in NOTABLE_CALLS)),
                   key=lambda n: -more(n))[:top]
    lines.append(f"CUDA runtime and driver calls (calls, total ms, longest ms, calls of {SLOW_CALL_MS} ms or more: "
                 f"first | steady):")
    for name in shown:
        f, s = first_calls.get(name, none), calls.get(name, none)
        lines.append(f"  {name[:34]:34} {int(f[0]):6d} {f[1]:8.2f} {f[2]:7.2f} {int(f[3]):4d} | {int(s[0]):6d} "
                     f"{s[1]:8.2f} {s[2]:7.2f} {int(s[3]):4d}")

    python = python_diff(directory / "first.pstats", directory / "steady.pstats", top)
    lines.append("Python functions, self time beyond the steady request's (ms more; calls first, steady; ms first):")
    lines += [f"  {m:8.2f}  {c:7d} {sc:7d} {t:8.2f}  {name[:80]}" for name, m, c, sc, t in python["self"] if m > 0]
    lines.append("Python functions, cumulative time beyond the steady request's (same columns):")
    lines += [f"  {m:8.2f}  {c:7d} {sc:7d} {t:8.2f}  {name[:80]}" for name, m, c, sc, t in python["cumulative"]
              if m > 0]

    for label in ("first", "steady"):
        state = around[label]
        memory = ", ".join(f"{key} {value:+}" for key, value in state["memory"].items()) or "none (no CUDA)"
        lines.append(f"{label}: allocator {memory}")
        lines.append(f"{label}: builds pending {state['pending_builds']} (waited "
                     f"{state['build_wait_s'] * 1e3:.1f} ms); imported {len(state['imported'])} "
                     f"module(s) {', '.join(state['imported'][:6])}")
    threads = around["first"]["threads"]
    lines.append(f"threads at the first request ({len(threads)}): {', '.join(threads)}")
    lines.append("versions: " + ", ".join(f"{key} {value}" for key, value in record["versions"].items()))
    data = {"traces": {"first": first, "steady": steady}, "python": python, "around": around,
            "walls": walls}
    return lines, data


# -- the runs ------------------------------------------------------------------------------------------------

class Stopped(BaseException):
    """SIGTERM (a timeout): the run ends early, reporting what it has."""


def _stop(*_: object) -> None:
    raise Stopped


class Runner:
    """Starts the example's child with each arm's switches, one start at a time; stops the one running if this
    process is stopped."""

    def __init__(self, bench: Any, size: str, checkpoint: Path, work: Path, example_args: tuple[str, ...]) -> None:
        self.bench, self.size, self.checkpoint, self.work = bench, size, checkpoint, work
        self.example_args = example_args

    def run(self, arm: str, cache: Path, profile_dir: Path | None = None) -> dict[str, Any]:
        extra = (*ARMS[arm], *self.example_args) + (("--profile-dir", str(profile_dir)) if profile_dir else ())
        self.bench.drop_from_page_cache(self.checkpoint)
        process = self.bench.start("buildops", self.size, self.checkpoint, cache, self.work, extra=extra,
                                   entry=(str(Path(__file__).resolve()), "--child"))
        try:
            return self.bench.finish(process)
        except BaseException:
            if process.poll() is None:
                process.kill()
                process.wait()
            raise


def write_json(path: Path | None, data: dict[str, Any]) -> None:
    if path is not None:
        from buildops._runtime.files import write_atomically

        write_atomically(path, json.dumps(data, indent=1, default=str))


def profile(runner: Runner, arm: str, cache: Path, keep: Path | None) -> dict[str, Any]:
    directory = runner.work / f"profile-{arm}"
    directory.mkdir()
    result = runner.run(arm, cache, directory)
    lines, data = profile_diff(directory, result["first_request"])
    print(f"\nprofile of a (d) restart, arm {arm} (not in the table):")
    print("\n".join(f"  {line}" for line in lines), flush=True)
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for label in ("first", "steady"):
            with open(directory / f"{label}.trace.json", "rb") as source, \
                    gzip.open(keep / f"{arm}-{label}.trace.json.gz", "wb") as target:
                shutil.copyfileobj(source, target)
    return data


def profile_arms(runner: Runner, arms: list[str], ran: list[str], keep: Path | None) -> dict[str, Any]:
    """Profile a restart of each arm, on the cache its first round's (c) left, or one a (c) start makes now."""
    profiles = {}
    for arm in arms:
        cache = runner.work / f"cache-{arm}-1"
        try:
            if arm not in ran:
                cache = runner.work / f"cache-{arm}-profile"
                runner.run(arm, cache)
            profiles[arm] = profile(runner, arm, cache, keep)
        except (Exception, SystemExit) as error:  # noqa: BLE001 - a profile that fails (its start too: the helper
            # exits with the start's log) must not cost the comparison its rounds
            print(f"\nthe profile of arm {arm} failed: {type(error).__name__}: {error}", flush=True)
            profiles[arm] = {"error": f"{type(error).__name__}: {error}"}
    return profiles


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="base")
    parser.add_argument("--starts", type=int, default=5, help="rounds: (c) and (d) of each arm per round")
    parser.add_argument("--arms", default="before,after", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--profile", action="store_true", help="profile a (d) restart of each --profile-arms arm")
    parser.add_argument("--profile-arms", default="before")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="begin no round that would end after this many seconds from launch (0: no limit)")
    parser.add_argument("--json", type=Path, help="write every start's figures, the profiles and the table here")
    parser.add_argument("--keep-traces", type=Path, help="copy the profiles' chrome traces here (gzipped)")
    parser.add_argument("--example-args", default="", help="more arguments for every start of the example")
    parser.add_argument("--no-prime", action="store_true", help="skip the untimed start that primes bytecode")
    args = parser.parse_args(argv)
    for name in ("arms", "profile_arms"):
        chosen = [a for a in getattr(args, name).split(",") if a]
        unknown = [a for a in chosen if a not in ARMS]
        if unknown or not chosen:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)!r}: expected arms among {', '.join(ARMS)}")
        setattr(args, name, chosen)
    if args.starts < 0:
        parser.error("--starts: expected a number >= 0")
    return args


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    sys.path.insert(0, str(ROOT))
    import startup as bench  # benchmarks/startup.py: this script's folder is on sys.path

    work = Path(tempfile.mkdtemp(prefix="buildops-first-request-"))
    checkpoint = bench.ensure_checkpoint(args.size)
    if not args.no_prime:
        bench.prime_bytecode(work)
    runner = Runner(bench, args.size, checkpoint, work, tuple(shlex.split(args.example_args)))
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    rounds_done, longest = 0, 0.0
    data: dict[str, Any] = {"argv": argv, "arms": {a: ARMS[a] for a in args.arms}}
    try:
        for index in range(1, args.starts + 1):
            if args.budget_s and index > 1 and time.perf_counter() - LAUNCHED + longest > args.budget_s:
                print(f"stopped after {rounds_done} round(s): the next would end past --budget-s", flush=True)
                break
            began = time.perf_counter()
            order = args.arms if index % 2 else args.arms[::-1]
            for kind in ("(c)", "(d)"):
                for arm in order:
                    row = {"round": index, "start": kind, "arm": arm,
                           **start_row(runner.run(arm, work / f"cache-{arm}-{index}"))}
                    rows.append(row)
                    print(describe_start(f"round {index} {kind} {arm}", row), flush=True)
            rounds_done, longest = index, max(longest, time.perf_counter() - began)
            if index == 1 and args.profile:
                profiles = profile_arms(runner, args.profile_arms, args.arms, args.keep_traces)
            write_json(args.json, {**data, "starts": rows, "profiles": profiles, "medians": medians(rows, args.arms)})
        if args.profile and not rounds_done:
            profiles = profile_arms(runner, args.profile_arms, [], args.keep_traces)
    except Stopped:
        print("stopped (SIGTERM): the table holds the starts that ended", flush=True)
    finally:
        table = medians(rows, args.arms)
        if table:
            print(f"\nfirst request against the steady median, medians over {rounds_done or 'the started'} "
                  f"round(s) (ratio: of the same start; repeat ratio: its slowest repeat of one request, the "
                  f"host's own swing; worst: the highest over the starts):")
            print(format_table(table))
        tokens = {json.dumps(r["tokens"]) for r in rows}
        if len(tokens) > 1:
            print(f"note: the starts served {len(tokens)} different token lists")
        write_json(args.json, {**data, "starts": rows, "profiles": profiles, "medians": table,
                               "rounds": rounds_done})
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
    else:
        main(sys.argv[1:])
