"""A build given up while its compiler hangs leaves no process behind once the program exits: not the compiler,
not a child of the compiler, under either executor."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

# Ends within the build timeout: the script's exit, not this, is what is timed.
EXIT_WITHIN = 60.0
# How long the compilers may take to be gone once the script has exited.
GONE_WITHIN = 10.0

# Triton asks ptxas its version first (knobs.NvidiaTool.from_path): answered as Triton's own ptxas does. On the
# kernel orphan_marker the fake does what it is told (__ON_MARKED__); on any other kernel it runs the real ptxas.
FAKE_PTXAS = r"""#!/bin/bash
if [ "$1" = "--version" ]; then
    printf '%s\n' "ptxas: NVIDIA (R) Ptx optimizing assembler" "Copyright (c) 2005-2025 NVIDIA Corporation" \
        "Built on Fri_Feb_21_20:21:21_PST_2025" "Cuda compilation tools, release 12.8, V12.8.93" \
        "Build cuda_12.8.r12.8/compiler.35583870_0"
    exit 0
fi
for arg in "$@"; do
    if [ -f "$arg" ] && grep -q orphan_marker "$arg"; then
        __ON_MARKED__
    fi
done
exec "__REAL__" "$@"
"""
# Hang, with a child of the compiler's own, marked by its name.
HANG = """(exec -a "__MARK__" sleep 600) &
        wait"""


def fake_ptxas(tmp_path, on_marked, prefix="buildops-orphan"):
    """A fake ptxas in ``tmp_path`` that runs ``on_marked`` (bash; ``__MARK__`` stands for the mark) on the kernel
    ``orphan_marker``; returns its path and the mark its processes' command lines carry."""
    triton = pytest.importorskip("triton")
    real = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.access(real, os.X_OK):
        pytest.skip("Triton without its ptxas")
    mark = f"{prefix}-{uuid.uuid4().hex}"
    ptxas = tmp_path / f"ptxas-{mark}"
    ptxas.write_text(FAKE_PTXAS.replace("__ON_MARKED__", on_marked).replace("__MARK__", mark)
                     .replace("__REAL__", real))
    ptxas.chmod(0o755)
    return ptxas, mark


def script_env(tmp_path, ptxas, mark, executor, build_timeout):
    """The environment the script runs in: one build thread of ``executor``, the fake ptxas, a cache of its own.
    The fake stands for both of Triton's ptxas: from 3.9 on, sm_90 compiles through ``ptxas-blackwell``."""
    return dict(os.environ, BUILDOPS_EXECUTOR=executor, BUILDOPS_THREADS="1", BUILDOPS_BUILD_TIMEOUT=build_timeout,
                TRITON_PTXAS_PATH=str(ptxas), TRITON_PTXAS_BLACKWELL_PATH=str(ptxas), ORPHAN_MARK=mark,
                TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), PYTHONPATH=os.pathsep.join(sys.path))


SCRIPT = r"""
import os
import time

import torch
import triton
import triton.language as tl

import buildops
from buildops import BuildConfig, DynamicSpec, lists_kernels


@triton.jit
def orphan_marker(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, -tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


@lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=[16])), output="x")
def negate(x):
    out = torch.empty_like(x)
    orphan_marker[(1,)](x, out, x.numel(), BLOCK=16)
    return out


if __name__ == "__main__":
    from multiprocessing import forkserver, resource_tracker

    with buildops.build_pass("orphans"):
        negate(torch.zeros(16))
    buildops.join()
    print("failed", buildops.report().total("failed"), flush=True)
    # Given up, the build's compiler goes at once (on the watchdog's thread), not only at exit.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    left += [pid] if os.environ["ORPHAN_MARK"].encode() in cmdline.read() else []
            except OSError:
                pass
        if not left:
            break
        time.sleep(0.1)
    # One string, one write: the given-up build's thread may print its compiler's error to stdout meanwhile
    print(f"left once given up {len(left)}", flush=True)
    helpers = [getattr(forkserver._forkserver, "_forkserver_pid", None), resource_tracker._resource_tracker._pid]
    print("helpers", *[pid for pid in helpers if pid], flush=True)
"""


def _alive_with(marks):
    """The pids of live processes whose command line names one of ``marks``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                line = cmdline.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(mark in line for mark in marks):
            found.append(int(pid))
    return found


def _helpers_alive(pids):
    """Those of ``pids`` that are still multiprocessing's forkserver or resource tracker."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                line = cmdline.read()
        except OSError:
            continue
        if b"forkserver" in line or b"resource_tracker" in line:
            alive.append(pid)
    return alive


def _kill(pids):
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_a_hung_compiler_and_its_children_do_not_outlive_the_program(tmp_path, executor):
    ptxas, mark = fake_ptxas(tmp_path, HANG)
    script = tmp_path / "hung_compiler.py"
    script.write_text(SCRIPT)
    env = script_env(tmp_path, ptxas, mark, executor, "5")
    # Pipes, read to their end: a compiler left holding them would hold this read too (bounded by the timeout).
    began = time.monotonic()
    try:
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                              timeout=EXIT_WITHIN, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        _kill(_alive_with([mark]))
        pytest.fail(f"the program's pipes stayed open {EXIT_WITHIN:.0f} s (left: {_alive_with([mark])})")
    ran = time.monotonic() - began
    try:
        assert done.returncode == 0, done.stderr[-3000:]
        assert "failed 1" in done.stdout, (done.stdout, done.stderr[-3000:])  # given up: it did hang
        assert "left once given up 0" in done.stdout, done.stdout
        deadline = time.monotonic() + GONE_WITHIN
        while _alive_with([mark]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive_with([mark]) == [], f"left behind after the exit ({ran:.1f} s run)"
        helpers = [int(pid) for line in done.stdout.splitlines() if line.startswith("helpers")
                   for pid in line.split()[1:]]
        while _helpers_alive(helpers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _helpers_alive(helpers) == [], "multiprocessing's helpers left behind after the exit"
    finally:
        _kill(_alive_with([mark]))


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_ctrl_c_ends_the_program_and_its_compilers(tmp_path, executor):
    """A terminal's Ctrl-C (SIGINT to the program's process group) while a compile hangs: the program exits, and no
    compiler is left, whether it got the signal itself (threads) or is in a worker's group of its own (processes)."""
    program, mark, out = _start_hanging(tmp_path, executor, start_new_session=True)
    try:
        os.killpg(program.pid, signal.SIGINT)
        program.wait(EXIT_WITHIN)
        deadline = time.monotonic() + GONE_WITHIN
        while _alive_with([mark]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive_with([mark]) == [], "left behind after Ctrl-C"
        assert "KeyboardInterrupt" in out.read_text(), out.read_text()[-3000:]
    finally:
        program.kill()
        _kill(_alive_with([mark]))


def _start_hanging(tmp_path, executor, **popen_kwargs):
    """The script, started with no build timeout, once its build's compiler hangs (with its child); its output goes
    to a file, not to pipes. Returns the program, the mark of its compiler's processes, and the file."""
    ptxas, mark = fake_ptxas(tmp_path, HANG)
    script = tmp_path / "hung_compiler.py"
    script.write_text(SCRIPT)
    env = script_env(tmp_path, ptxas, mark, executor, "0")
    out = tmp_path / "out"
    with open(out, "w") as output:
        program = subprocess.Popen([sys.executable, str(script)], env=env, stdout=output, stderr=output, cwd=tmp_path,
                                   **popen_kwargs)
    deadline = time.monotonic() + EXIT_WITHIN
    while len(_alive_with([mark])) < 2 and time.monotonic() < deadline:  # the compiler and its child
        time.sleep(0.1)
    if len(_alive_with([mark])) < 2:
        program.kill()
        _kill(_alive_with([mark]))
        pytest.fail(f"the compiler did not hang: {out.read_text()[-3000:]}")
    return program, mark, out


def test_worker_groups_end_with_a_program_killed_outright(tmp_path):
    """SIGKILL gives the program no exit hook: each worker sees its parent gone and kills its own group."""
    program, mark, out = _start_hanging(tmp_path, "processes")
    try:
        program.kill()
        program.wait(EXIT_WITHIN)
        deadline = time.monotonic() + GONE_WITHIN
        while _alive_with([mark]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive_with([mark]) == [], "left behind after the program was killed"
    finally:
        program.kill()
        _kill(_alive_with([mark]))


def test_a_blocks_processes_and_their_children_are_killed_and_no_other_threads():
    import threading

    from buildops._runtime import children
    from buildops._runtime.patching import applied

    mark = f"buildops-orphan-{uuid.uuid4().hex}"
    others = []
    try:
        with children.building() as started:
            other = threading.Thread(target=lambda: others.append(subprocess.Popen(["sleep", "600"])))
            other.start()
            other.join(10)
            compiler = subprocess.Popen(["bash", "-c", f'(exec -a "{mark}" sleep 600) & wait', mark])
            deadline = time.monotonic() + 10
            while len(_alive_with([mark])) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(_alive_with([mark])) == 2
            children.kill_started(started)
            assert compiler.wait(10) == -signal.SIGKILL
            assert started.pids == [compiler.pid]  # not the other thread's
            assert others[0].poll() is None
        assert not any(patch.attribute == "__init__" for patch in applied())  # only while a block runs
        deadline = time.monotonic() + 10
        while _alive_with([mark]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive_with([mark]) == []  # the compiler's own child too
    finally:
        _kill(_alive_with([mark]))
        for process in others:
            process.kill()
            process.wait(10)
