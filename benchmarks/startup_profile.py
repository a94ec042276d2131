"""Where a buildops start of examples/tiny_llm spends its time: one start, in this process, with a timeline of its
phases and builds and the sampled stacks of its main thread, its autotuning thread and its builder threads.

    python3 benchmarks/startup_profile.py [--depth 3] [--load-after-rehearsal] [--size base]

Run from the repository root on the GPU machine, after ``benchmarks/startup.py`` made the checkpoint; with
``PYTHONPYCACHEPREFIX=/tmp/buildops-startup-pycache`` it imports from the bytecode that benchmark cached, as its
starts do (without it, a host whose site-packages lack bytecode compiles torch's and sympy's sources). Each run
uses an empty Triton cache in a temporary directory (``TRITON_CACHE_DIR`` if set) and reads the checkpoint from
disk. Stacks are sampled every 5 ms (builder threads every 20 ms) by a Python thread, which needs the GIL itself:
a thread that waits for the GIL shows in the C call it returns from.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

LAUNCHED = time.perf_counter()

from buildops.startup import start_build_workers  # noqa: E402 - before torch, as the example does

if __name__ == "__main__":
    # Before the workers start: the build of Triton's helper module, begun with them, takes the cache from the
    # environment as it is then.
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="buildops-profile-triton-"))
    start_build_workers()

import collections  # noqa: E402
import contextlib  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"buildops-serial": "autotuning", "buildops-worker": "builders", "buildops-prepare": "preparation"}
DEPTH = 3  # frames shown per stack, innermost first (--depth)


class Sampler:
    def __init__(self) -> None:
        self.samples: list[tuple[float, str, tuple[str, ...]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        main, tick = threading.main_thread().ident, 0
        while not self._stop.wait(0.005):
            names = {t.ident: t.name for t in threading.enumerate()}
            now = time.perf_counter() - LAUNCHED
            for ident, frame in sys._current_frames().items():
                name = names.get(ident, "")
                kind = "main" if ident == main else next((k for p, k in KINDS.items() if name.startswith(p)), None)
                if kind is None or (kind == "builders" and tick % 4):
                    continue
                stack = []
                while frame is not None:
                    stack.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")
                    frame = frame.f_back
                self.samples.append((now, kind, tuple(stack)))
            tick += 1

    def top(self, kind: str, start: float, end: float, n: int = 12) -> list[str]:
        """The innermost frames most often seen, with the share of samples, as text lines."""
        stacks = [s for t, k, s in self.samples if k == kind and start <= t <= end]
        counts = collections.Counter(" <- ".join(s[:DEPTH]) for s in stacks if s)
        return [f"    {c / len(stacks):6.1%}  {frames}" for frames, c in counts.most_common(n)]


def main() -> None:
    global DEPTH
    if "--depth" in sys.argv:
        at = sys.argv.index("--depth")
        DEPTH = int(sys.argv[at + 1])
        del sys.argv[at:at + 2]
    sys.path.insert(0, str(ROOT))
    import buildops
    import buildops.startup as startup

    import examples.tiny_llm.__main__ as example

    checkpoint = Path(tempfile.gettempdir()) / "buildops-tiny-llm" / "base.safetensors"
    if checkpoint.exists():
        from benchmarks.startup import drop_from_page_cache
        drop_from_page_cache(checkpoint)

    phases = []
    timed_phase = startup.phase

    @contextlib.contextmanager
    def phase(name: str):
        start = time.perf_counter() - LAUNCHED
        with timed_phase(name):
            yield
        phases.append((name, start, time.perf_counter() - LAUNCHED))

    last_report = None
    shutdown = buildops.shutdown

    def report_then_shutdown(*args, **kwargs) -> None:  # the example's last step forgets the builder's history
        nonlocal last_report
        last_report = buildops.report()
        shutdown(*args, **kwargs)

    startup.phase = example.phase = phase
    buildops.shutdown = report_then_shutdown
    sys.argv = ["tiny_llm", "--start", "buildops", *sys.argv[1:]]
    example.LAUNCHED = LAUNCHED
    with Sampler() as sampler:
        try:
            example.main()
        finally:
            builds = [(r.build, r.started - LAUNCHED, r.started - LAUNCHED + r.seconds, r.waited)
                      for r in (last_report or buildops.report()).builds if r.started is not None]
            report(phases, builds, sampler)


def report(phases: list, builds: list, sampler: Sampler) -> None:
    print("\nphases (s since launch):")
    for name, start, end in phases:
        print(f"  {name:32} {start:6.2f} -> {end:6.2f}  ({end - start:.2f})")
    compiles = [b for b in builds if not b[0].serial]
    tunes = [b for b in builds if b[0].serial]
    if compiles:
        print(f"compile builds: {len(compiles)}, first began {min(b[1] for b in compiles):.2f}, last ended "
              f"{max(b[2] for b in compiles):.2f}, summed {sum(b[2] - b[1] for b in compiles):.2f} s")
    if tunes:
        print(f"autotuning builds: {len(tunes)}, first began {min(b[1] for b in tunes):.2f}, last ended "
              f"{max(b[2] for b in tunes):.2f}; tuning {sum(b[2] - b[1] - b[3] for b in tunes):.2f} s, waiting "
              f"for compiles {sum(b[3] for b in tunes):.2f} s")
    for kind, chosen in (("compile builds", compiles), ("autotuning builds", tunes)):
        if chosen:  # when each quarter of them had begun and had ended
            began, ended = sorted(b[1] for b in chosen), sorted(b[2] for b in chosen)
            at = [max(0, round(len(chosen) * q) - 1) for q in (0.25, 0.5, 0.75, 1.0)]
            print(f"{kind}, a quarter / half / three quarters / all: began by "
                  + " / ".join(f"{began[i]:.2f}" for i in at)
                  + "; ended by " + " / ".join(f"{ended[i]:.2f}" for i in at))
    for name, start, end in phases:
        print(f"\n{name}: main thread")
        print("\n".join(sampler.top("main", start, end)))
    for kind, chosen in (("autotuning", tunes), ("builders", compiles)):
        if chosen:
            start, end = min(b[1] for b in chosen), max(b[2] for b in chosen)
            print(f"\n{kind} threads, {start:.2f} -> {end:.2f}")
            print("\n".join(sampler.top(kind, start, end)))
    preparing = [t for t, k, _s in sampler.samples if k == "preparation"]
    if preparing:
        print(f"\npreparation thread, {min(preparing):.2f} -> {max(preparing):.2f}")
        print("\n".join(sampler.top("preparation", min(preparing), max(preparing))))


if __name__ == "__main__":
    main()
