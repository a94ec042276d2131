"""Worker pools: the processes that Triton and DeepGEMM builds run in."""

import os

import pytest

from buildops._runtime.pools import WorkerPool

GIVEN_UP = "buildops: stuck was given up, and its test worker stopped"


def call_in_thread(pool, what, fn, *args, given_up=None):
    """``pool.run(what, fn, *args)`` on a thread; returns the thread and a list that gets what the call returned,
    or its RuntimeError's message."""
    import threading
    outcome = []

    def call():
        try:
            outcome.append(pool.run(what, fn, *args, given_up=given_up))
        except RuntimeError as error:
            outcome.append(str(error))

    thread = threading.Thread(target=call)
    thread.start()
    return thread, outcome


def test_forked_workers_take_the_environment_their_pool_starts_with(monkeypatch):
    """A worker forked from the forkserver has this process's environment as its pool starts, not the one the
    forkserver started with: what an engine sets later (DeepGEMM's cache directory, say) reaches its builds, as it
    reaches spawned workers'."""
    earlier = WorkerPool("test", lambda: 1, preload=("json",))
    try:
        earlier.run("a pid", os.getpid)  # the forkserver runs from here on
    finally:
        earlier.shutdown()
    monkeypatch.setenv("BUILDOPS_TEST_SET_LATER", "seen")
    pool = WorkerPool("test", lambda: 1, preload=("json",))
    try:
        assert pool.run("a variable", os.getenv, "BUILDOPS_TEST_SET_LATER") == "seen"
    finally:
        pool.shutdown()


def test_a_forked_child_starts_workers_of_its_own():
    """The child forgets the parent's pool and the parent's forkserver, and builds through its own."""
    pool = WorkerPool("test", lambda: 1, preload=("json",))
    try:
        parent_worker = pool.run("a pid", os.getpid)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                child_worker = pool.run("a pid", os.getpid)
                os.write(write, b"own workers" if child_worker != parent_worker else b"the parent's workers")
            except BaseException as error:  # noqa: BLE001 - reported to the parent
                os.write(write, repr(error).encode()[:200])
            finally:
                pool.shutdown()
                os._exit(0)
        os.close(write)
        assert os.read(read, 300) == b"own workers"
        assert os.waitpid(pid, 0)[1] == 0
        assert pool.run("a pid", os.getpid) == parent_worker  # the parent's pool is untouched
    finally:
        pool.shutdown()


def test_workers_lower_their_cpu_priority_by_the_setting_read_when_the_pool_starts():
    from buildops import settings

    mine = os.nice(0)
    for nice, expected in [(5, min(19, mine + 5)), (0, mine)]:
        with settings.scope(worker_nice=nice):
            pool = WorkerPool("test", lambda: 1)
            pool.get()
        try:  # the scope has ended: the workers keep what the pool started with
            assert pool.run("its niceness", os.nice, 0) == expected
        finally:
            pool.shutdown()


def test_a_crashing_build_fails_alone_and_the_builds_beside_it_finish():
    import threading
    import time

    import pool_tasks

    pool = WorkerPool("test", lambda: 2)
    try:
        warm = [pool.get().submit(pool_tasks.slow, 0.2) for _ in range(2)]
        assert [f.result(60) for f in warm] == [0.2, 0.2]  # both workers up
        results = {}

        def run(what, fn, *args):
            try:
                results[what] = pool.run(what, fn, *args)
            except RuntimeError as error:
                results[what] = str(error)

        beside = threading.Thread(target=run, args=("beside", pool_tasks.slow, 2.0))
        beside.start()
        time.sleep(0.3)  # running in a worker when the other worker dies, and its retry when the retry dies
        run("crasher", pool_tasks.crash, 0.5)
        beside.join(60)
        assert results == {"beside": 2.0, "crasher": "buildops: test worker crashed twice building crasher "
                                                      "(the worker exited with status 3)"}
    finally:
        pool.shutdown()


def test_a_build_that_crashes_its_worker_natively_says_of_which_signal():
    import pool_tasks

    pool = WorkerPool("test", lambda: 1)
    try:
        with pytest.raises(RuntimeError, match=r"crashed twice building probe \(the worker died of SIGSEGV\)$"):
            pool.run("probe", pool_tasks.segfault)
    finally:
        pool.shutdown()


def test_a_crash_watch_refuses_only_with_nothing_returned_nothing_running_and_three_native_crashes():
    import signal

    from buildops._runtime.crashes import CrashWatch

    watch = CrashWatch("test")
    watch.crashed("killed", -signal.SIGKILL)  # from outside (the OOM killer): not the library's crash
    watch.crashed("exited", 3)
    with watch.running():
        for name in "abc":
            watch.crashed(name, -signal.SIGSEGV)
        watch.refuse("beside a running call")  # which may yet return: not refused
    with pytest.raises(RuntimeError, match=r"^buildops: d not tried: test workers crashed on a, b, c and built "):
        watch.refuse("d")
    watch.returned(None)
    watch.refuse("after a call returned")  # then every crash was one kernel's


@pytest.mark.parametrize("built_first", [False, True])
def test_a_pool_whose_every_build_crashes_stops_trying_and_one_that_built_goes_on(built_first):
    """A library that crashes natively in every worker (a broken install) costs its pass three builds' crashes, not
    one per kernel; where a build has succeeded, crashes are single kernels' and every build is still tried."""
    import pool_tasks

    pool = WorkerPool("test", lambda: 1)
    try:
        # a call that is not a build (as DeepGEMM's pool opens a context to measure it) proves nothing of the builds
        assert pool.run("a probe", pool_tasks.slow, 0.0, build=False) == 0.0
        if built_first:
            assert pool.run("first", pool_tasks.slow, 0.0) == 0.0
        with pytest.raises(RuntimeError, match="crashed twice building an exit "):
            pool.run("an exit", pool_tasks.crash, 0.0)  # an exit status, not the library's native crash: not counted
        for name in ("a", "b", "c"):
            with pytest.raises(RuntimeError, match=f"crashed twice building {name} "):
                pool.run(name, pool_tasks.segfault)
        if built_first:
            assert pool.run("fourth", pool_tasks.slow, 0.0) == 0.0
        else:
            with pytest.raises(RuntimeError, match=r"fourth not tried: test workers crashed on a, b, c and built "
                                                   r"nothing$"):
                pool.run("fourth", pool_tasks.slow, 0.0)
            pool.shutdown()
            assert pool.run("after a shutdown", pool_tasks.slow, 0.0) == 0.0  # a new pool tries again
    finally:
        pool.shutdown()


def test_shutdown_with_a_timeout_does_not_wait_for_a_worker_still_building():
    import time

    import buildops

    import pool_tasks

    pool = WorkerPool("test", lambda: 1)
    try:
        assert pool.run("warm", pool_tasks.slow, 0.0) == 0.0
        building = pool.get().submit(pool_tasks.slow, 5.0)
        time.sleep(0.3)
        began = time.monotonic()
        buildops.shutdown(timeout=0.5)
        assert time.monotonic() - began < 2.5 and not pool.started
        assert building.result(30) == 5.0  # told to stop, the worker finishes its build and exits
    finally:
        pool.shutdown()


def test_the_forkserver_imports_the_first_modules_before_the_others_and_keeps_what_was_asked_but_main():
    from multiprocessing import forkserver

    from buildops._runtime.main_module import context as _context

    server = forkserver._forkserver
    saved = getattr(server, "_preload_modules", None)
    try:
        server._preload_modules = ["__main__", "someone_elses"]
        _context(("torch", "late"), ("early",))
        assert server._preload_modules == ["early", "someone_elses", "torch", "late"]  # the workers import no main
    finally:
        if saved is None:
            del server._preload_modules
        else:
            server._preload_modules = saved


TRITON_PRELOAD = r"""
import sys, threading
from buildops.backends.triton.worker import FORKSERVER_PRELOAD, FORKSERVER_PRELOAD_FIRST
for name in FORKSERVER_PRELOAD_FIRST:  # as the forkserver does: in order
    __import__(name)
from buildops.backends.triton import preload as _triton_preload
hashing_meanwhile = _triton_preload.hashing is not None and "torch" not in sys.modules
for name in FORKSERVER_PRELOAD:
    __import__(name)
from triton.runtime.cache import triton_key
from buildops.backends.triton.state import triton_state
print(hashing_meanwhile, triton_key.cache_info().currsize, triton_state.warmed_for,
      [t.name for t in threading.enumerate() if t.name.startswith("buildops")])
"""


def test_the_triton_forkserver_hashes_triton_beside_the_torch_import_and_forks_warm_with_no_thread(tmp_path):
    import subprocess
    import sys
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", TRITON_PRELOAD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.split("\n")[0] == "True 1 ('cuda', 90, 32) []", done.stderr[-3000:]


def test_a_call_given_up_stops_the_workers_and_only_the_others_are_retried():
    import threading
    import time

    import pool_tasks

    pool = WorkerPool("test", lambda: 2)
    try:
        warm = [pool.get().submit(pool_tasks.slow, 0.2) for _ in range(2)]  # both workers up
        [f.result(60) for f in warm]
        given_up = threading.Event()
        stuck, stuck_outcome = call_in_thread(pool, "stuck", pool_tasks.slow, 600, given_up=given_up)
        beside, beside_outcome = call_in_thread(pool, "beside", pool_tasks.slow, 1.0)
        time.sleep(0.5)  # both in a worker
        given_up.set()
        pool.stop_workers()
        stuck.join(30), beside.join(60)
        assert stuck_outcome == [GIVEN_UP]
        assert beside_outcome == [1.0]  # retried alone
        assert pool.run("after", pool_tasks.slow, 0.0) == 0.0  # a new pool
        started = time.monotonic()
    finally:
        pool.shutdown()
    assert time.monotonic() - started < 30  # no worker left stuck to wait for


def test_the_triton_forkserver_preload_survives_a_torch_that_fails_to_load(tmp_path):
    import subprocess
    import sys
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise OSError('libcudnn.so.9: cannot open shared object file')\n")
    script = (f"import sys, threading; sys.path.insert(0, {str(fake.parent)!r})\n"
              "from buildops.backends.triton.worker import FORKSERVER_PRELOAD, FORKSERVER_PRELOAD_FIRST\n"
              "for name in FORKSERVER_PRELOAD_FIRST + FORKSERVER_PRELOAD:\n"
              "    try:\n"
              "        __import__(name)\n"
              "    except ImportError:\n"  # all the forkserver ignores: anything else kills it
              "        pass\n"
              "print([t.name for t in threading.enumerate() if t.name.startswith('buildops')])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache")))
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-3000:]


def test_stop_workers_also_stops_a_call_stuck_in_its_retry_alone(tmp_path):
    import threading
    import time

    import pool_tasks

    pool = WorkerPool("test", lambda: 1)
    given_up = threading.Event()
    caller, outcome = call_in_thread(pool, "stuck", pool_tasks.crash_then_hang, str(tmp_path / "crashed"),
                                     given_up=given_up)
    try:
        for _ in range(600):  # until the retry runs in a pool of its own
            if pool._alone and any(getattr(p, "_processes", None) for p in list(pool._alone)):
                break
            time.sleep(0.1)
        time.sleep(0.5)
        given_up.set()
        pool.stop_workers()
        caller.join(30)
        assert not caller.is_alive() and outcome == [GIVEN_UP]
    finally:
        given_up.set()
        pool.stop_workers()
        pool.shutdown()


def test_a_worker_left_building_by_a_shutdown_with_a_deadline_is_stopped_when_its_call_is_given_up():
    import threading
    import time

    import pool_tasks

    pool = WorkerPool("test", lambda: 1)
    given_up = threading.Event()
    caller, outcome = call_in_thread(pool, "stuck", pool_tasks.slow, 600, given_up=given_up)
    try:
        for _ in range(600):  # until the call is in its worker
            if getattr(pool._pool, "_processes", None) and pool._pool._pending_work_items:
                break
            time.sleep(0.1)
        [worker] = pool._pool._processes.values()
        pool.shutdown(wait=True, deadline=time.monotonic() + 0.2)  # buildops.shutdown(timeout=0.2)
        assert worker.is_alive()  # not waited for
        given_up.set()
        pool.stop_workers()  # the watchdog gives the build up
        worker.join(30)
        caller.join(30)
        assert not worker.is_alive() and not caller.is_alive() and outcome == [GIVEN_UP]
    finally:
        given_up.set()
        pool.stop_workers()


def test_shutdown_does_not_wait_for_good_for_a_pool_stuck_starting(monkeypatch):
    import threading
    import time

    import buildops._runtime.pools

    pool = WorkerPool("test", lambda: 1)
    release = threading.Event()
    holder = threading.Thread(target=lambda: (pool._lock.acquire(), release.wait(30), pool._lock.release()))
    holder.start()  # as get() holds it while a forkserver's preload hangs
    try:
        started = time.monotonic()
        pool.shutdown(wait=True, deadline=time.monotonic() + 0.3)
        monkeypatch.setattr(buildops._runtime.pools, "START_WAIT_SECONDS", 0.3)
        pool.shutdown()
        assert time.monotonic() - started < 10
    finally:
        release.set()
        holder.join(30)


EXIT_WITH_A_STUCK_WORKER = r"""
import threading
import pool_tasks
from buildops._runtime.pools import WorkerPool

if __name__ == "__main__":
    pool = WorkerPool("test", lambda: 1)
    pool.run("warm", pool_tasks.slow, 0)
    threading.Thread(target=pool.run, args=("stuck", pool_tasks.slow, 600), daemon=True).start()
    pool_tasks.slow(1)  # the call reaches its worker; then the program ends without shutting buildops down
"""


def run_script(tmp_path, name, source, timeout):
    """``source`` written to ``name`` and run as the main script, with this directory importable; its outcome."""
    import subprocess
    import sys
    from pathlib import Path
    script = tmp_path / name
    script.write_text(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=timeout)


def test_the_process_exits_though_a_worker_is_stuck_in_a_build(tmp_path):
    done = run_script(tmp_path, "exits.py", EXIT_WITH_A_STUCK_WORKER, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]  # not held for the stuck task's 600 s


def test_a_shutdown_before_the_background_start_has_begun_keeps_the_workers_from_starting():
    import threading

    import buildops

    from conftest import WAIT, until

    pool = WorkerPool("test", lambda: 1)
    begin, launch = threading.Event(), pool._launch
    pool._launch = lambda: (begin.wait(WAIT), launch())  # the start's thread, not yet at the pool
    try:
        pool.start()
        buildops.shutdown()
        assert not pool.started
        begin.set()
        assert until(lambda: not any(t.name == "buildops-test-start" for t in threading.enumerate()))
        assert not pool.started  # not started after the shutdown, with no one left to stop it
    finally:
        begin.set()
        pool.shutdown()


def test_no_pool_starts_once_the_exit_has_stopped_the_workers():
    pool = WorkerPool("test", lambda: 1)
    pool._at_exit()  # as at interpreter exit
    with pytest.raises(RuntimeError, match="the interpreter is exiting"):
        pool.get()
    assert not pool.started


# The workers are still starting as the program ends: their forkserver answers late (as while it imports its
# preload), and the exit takes a while after multiprocessing's own exit hook (which removes every pool's semaphores).
EXIT_WHILE_WORKERS_START = r"""
import atexit, time
atexit.register(time.sleep, 3)  # registered before multiprocessing's hook, so it runs after it

import multiprocessing.forkserver, os, threading
from buildops._runtime.pools import WorkerPool

connect, asked = multiprocessing.forkserver.connect_to_new_process, threading.Event()

def answered_late(fds):
    asked.set()
    time.sleep(1)
    return connect(fds)

multiprocessing.forkserver.connect_to_new_process = answered_late
pool = WorkerPool("test", lambda: 2, warm_up=os.getpid, preload=("json",))
pool.start()
assert asked.wait(30)  # the first worker is being forked as the program ends
"""


def test_an_exit_while_the_workers_start_waits_for_them_and_prints_no_traceback(tmp_path):
    done = run_script(tmp_path, "exit_while_starting.py", EXIT_WHILE_WORKERS_START, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]  # no worker forked once its semaphores were gone


def main_module_of_this_process():
    """What a worker has of the parent's main module (run in a worker: importable from here)."""
    import sys
    return [getattr(sys.modules.get(name), "__file__", None) for name in ("__main__", "__mp_main__")]


def test_workers_spawned_or_forked_from_the_forkserver_do_not_import_the_main_module():
    import sys
    assert getattr(sys.modules["__main__"], "__file__", None)  # pytest's, which workers would import otherwise
    for pool in (WorkerPool("test", lambda: 1), WorkerPool("test", lambda: 1, preload=("json",))):
        try:
            assert pool.run("its main module", main_module_of_this_process) == [None, None]
        finally:
            pool.shutdown()


def test_only_the_thread_starting_a_worker_leaves_the_main_module_out_of_the_preparation_data():
    import multiprocessing.spawn
    import threading

    from buildops._runtime import main_module

    original = multiprocessing.spawn.get_preparation_data
    theirs = {}
    ours_started, theirs_done = threading.Event(), threading.Event()

    def another_user_of_multiprocessing():
        assert ours_started.wait(30)
        theirs.update(multiprocessing.spawn.get_preparation_data("theirs"))
        theirs_done.set()

    other = threading.Thread(target=another_user_of_multiprocessing)
    other.start()
    with main_module._keeping_main_out():
        ours = multiprocessing.spawn.get_preparation_data("ours")
        ours_started.set()
        assert theirs_done.wait(30)  # prepared while ours starts
    other.join(30)
    assert not set(main_module._MAIN_KEYS) & set(ours)
    assert set(main_module._MAIN_KEYS) & set(theirs)  # their children still import the main module, as they expect
    assert multiprocessing.spawn.get_preparation_data is original and not main_module._PREPARATION.active


def test_a_call_that_names_something_of_the_main_module_is_refused_before_any_worker_starts(monkeypatch):
    import __main__

    import pool_tasks

    class FromMain:
        pass

    FromMain.__module__, FromMain.__qualname__ = "__main__", "FromMain"
    monkeypatch.setattr(__main__, "FromMain", FromMain, raising=False)  # it pickles, but workers cannot find it
    pool = WorkerPool("test", lambda: 1)
    with pytest.raises(ImportError, match="a call passes FromMain of the main module to a test worker"):
        pool.run("a call", pool_tasks.slow, FromMain())
    assert not pool.started


# A worker that imports the main module all the same (where another library started the forkserver with it
# preloaded), here by undoing what keeps it out; the module starts builds as it is imported.
MAIN_IN_WORKERS = r"""
import contextlib, json, os, time
import buildops._runtime.main_module as main_module
import buildops._runtime.pools as pools
import pool_tasks

main_module._keeping_main_out = contextlib.nullcontext
pool = pools.WorkerPool("test", lambda: 2)
began = time.monotonic()
errors = []
for call in ("first", "second"):
    try:
        pool.run(call, pool_tasks.slow, 0)
    except RuntimeError as error:
        errors.append(str(error))
seconds = time.monotonic() - began
warming = pools.WorkerPool("warming", lambda: 1, warm_up=os.getpid)
warming.get()  # its workers start and warm up, with no call
while warming._main_ran is None and time.monotonic() < began + 60:
    time.sleep(0.1)
print(json.dumps({"errors": errors, "seconds": seconds, "noticed without a call": warming._main_ran is not None}))
pool.shutdown()
warming.shutdown()
"""


def test_a_worker_that_imports_a_main_module_starting_builds_fails_the_call_at_once_with_the_fix(tmp_path):
    import json
    script = tmp_path / "main_in_workers.py"
    done = run_script(tmp_path, script.name, MAIN_IN_WORKERS, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.splitlines()[-1])
    fix = (f"buildops: test workers imported {script} as they started, and it starts builds as it is imported; "
           'put that code under `if __name__ == "__main__":`')
    assert [e[:len(fix)] for e in outcome["errors"]] == [fix, fix], outcome  # the second without a worker
    assert outcome["seconds"] < 60  # not a build timeout
    assert outcome["noticed without a call"]  # where workers are started early, the error is logged then
    assert "which starts builds as it is imported; the worker exits" in done.stderr
    assert "crashed" not in done.stderr  # not retried as a crash


NO_GUARD = r"""
import json, os
import torch
import triton
import triton.language as tl

import buildops
from buildops import BuildConfig, DynamicSpec, lists_kernels
from buildops.backends.triton.worker import workers
import triton_kernels

with open(os.environ["RUNS_FILE"], "a") as runs:  # module-level code: run once, by this process alone
    runs.write(f"{os.getpid()}\n")


@triton.jit
def _negate_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, -tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


@lists_kernels(BuildConfig(DynamicSpec("x", dim=0, sweep=[16, 64])), output="x")
def negate(x):
    out = torch.empty_like(x)
    _negate_kernel[(1,)](x, out, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    return out


in_workers = []
run_in_worker = workers.run


def counted(what, *args, **kwargs):
    done = run_in_worker(what, *args, **kwargs)
    in_workers.append(what)
    return done


workers.run = counted
with buildops.build_pass("no guard"):  # at module level, with no `if __name__ == "__main__":`
    triton_kernels.double_rows(torch.zeros(64, 32))
    negate(torch.zeros(64))
report = buildops.report()
print(json.dumps({"listed": report.total("listed"), "built": report.total("built"),
                  "failed": report.total("failed"), "in_workers": in_workers,
                  "ops": sorted(op.op for op in report.ops)}))
buildops.shutdown()
"""


def run_with_worker_processes(script, tmp_path, timeout=120):
    """``script`` run as the main script, with Triton builds forced into two worker processes; bounded by
    ``timeout`` (a stall fails the test)."""
    import subprocess
    import sys
    from pathlib import Path
    env = dict(os.environ, BUILDOPS_EXECUTOR="processes", BUILDOPS_THREADS="2",
               TRITON_CACHE_DIR=str(tmp_path / "triton-cache"), RUNS_FILE=str(tmp_path / "runs"),
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path)


def test_a_script_whose_pass_runs_at_module_level_builds_in_workers_and_runs_once(tmp_path):
    import json
    pytest.importorskip("triton")
    script = tmp_path / "no_guard.py"
    script.write_text(NO_GUARD)
    done = run_with_worker_processes(script, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome["ops"] == ["double_rows", "negate"], outcome
    assert outcome["failed"] == 0 and outcome["built"] == outcome["listed"] >= 4, (outcome, done.stderr[-3000:])
    # every build compiled in the workers, the script's own kernel too: it travelled as source
    assert set(outcome["in_workers"]) == {"triton_kernels.rows_kernel", "__main__._negate_kernel"}, outcome
    assert len((tmp_path / "runs").read_text().split()) == 1  # the module-level code ran once, here alone


def readme_example(guarded: bool) -> str:
    """The README's example (its one fenced python block), as written, or with its main guard's block run at
    module level, after starting the build workers there."""
    import re
    import textwrap
    from pathlib import Path
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    [example] = re.findall(r"^```python\n(.*?)^```", readme, re.S | re.M)
    if guarded:
        return example
    unguarded = re.sub(r'^if __name__ == "__main__":[^\n]*\n((?:(?:    [^\n]*)?\n)+)',
                       lambda block: textwrap.dedent(block.group(1)), example, flags=re.M)
    return "from buildops.startup import start_build_workers\nassert start_build_workers()\n" + unguarded


@pytest.mark.parametrize("guarded", [True, False], ids=["as written", "without its main guard"])
def test_the_readme_example_runs_with_worker_processes(tmp_path, guarded):
    import re
    pytest.importorskip("triton")
    script = tmp_path / "example.py"
    script.write_text(readme_example(guarded))
    done = run_with_worker_processes(script, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert sum(line.startswith("softmax ") for line in lines) == 1, done.stdout  # the report's row, printed once
    assert not [line for line in lines if line.startswith("failed:")], done.stdout
    assert "as it is imported" not in done.stderr, done.stderr[-3000:]  # no worker ran the example
    prebuilt = [int(m.group(1)) for m in map(re.compile(r"triton: (\d+) kernel\(s\) prebuilt").match, lines) if m]
    assert prebuilt and prebuilt[0] > 0, done.stdout


def test_a_call_for_an_urgent_build_gets_the_next_free_worker(tmp_path):
    """More calls than workers wait for turns, not in the executor's own first-in, first-out queue: a build that
    a serving call waits for goes first, even where it became urgent while it waited."""
    import threading

    from buildops._runtime.turns import urgency

    import pool_tasks
    from conftest import WAIT, until

    gate, order = tmp_path / "gate", tmp_path / "order"
    expedited = threading.Event()
    pool = WorkerPool("test", lambda: 1)

    def call(line, urgent=lambda: False):
        with urgency(urgent):
            pool.run(line, pool_tasks.append_line, str(order), line)

    try:
        holder, _ = call_in_thread(pool, "holder", pool_tasks.wait_for_file, str(gate))
        assert until(lambda: pool._turns._held == 1)
        callers = [threading.Thread(target=call, args=("queued first",)),
                   threading.Thread(target=call, args=("expedited", expedited.is_set))]
        for n, caller in enumerate(callers, start=1):
            caller.start()
            assert until(lambda n=n: len(pool._turns._waiting) == n)
        expedited.set()  # as Builder.expedite marks a build already waiting for a worker
        gate.touch()
        for thread in (holder, *callers):
            thread.join(WAIT)
        assert order.read_text().splitlines() == ["expedited", "queued first"]
    finally:
        gate.touch()
        pool.shutdown()


def test_a_limit_runs_fewer_calls_at_once_and_starts_fewer_workers():
    """A pool of 3 workers limited to 1 call at once runs calls one after another in one worker; raised to 3, it
    starts the other two as calls come."""
    import concurrent.futures
    import time

    import pool_tasks

    pool = WorkerPool("test", lambda: 3)
    try:
        pool.limit(1)  # before the pool starts, as DeepGEMM's sizing does after its first call
        with concurrent.futures.ThreadPoolExecutor(3) as callers:
            start = time.monotonic()
            pids = list(callers.map(lambda _: pool.run("a pid", pool_tasks.pid_after, 0.3), range(3)))
            assert len(set(pids)) == 1 and time.monotonic() - start >= 0.9
            pool.limit(3)
            pids = list(callers.map(lambda _: pool.run("a pid", pool_tasks.pid_after, 0.5), range(3)))
        assert len(set(pids)) == 3
    finally:
        pool.shutdown()
