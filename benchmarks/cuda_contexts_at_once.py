"""How long a CUDA context takes to open when several processes open theirs at one instant, as a DeepGEMM pass's
first workers do: each process imports torch, waits for a common instant, then opens its context on GPU 0.

    python3 benchmarks/cuda_contexts_at_once.py [1 12]

Prints, for each count of processes, the median and longest seconds a context took. Needs a GPU.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

START_AFTER_SECONDS = 12.0  # time for every process to import torch before the common instant


def child(at: float) -> tuple[float, bool]:
    """(seconds its context took, whether it was ready before the common instant)."""
    import torch

    on_time = time.time() < at
    while time.time() < at:
        time.sleep(0.001)
    started = time.perf_counter()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    return time.perf_counter() - started, on_time


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(float(sys.argv[2]))))
        return
    for count in map(int, sys.argv[1:] or ["1", "12"]):
        at = time.time() + START_AFTER_SECONDS
        processes = [subprocess.Popen([sys.executable, __file__, "--child", str(at)], stdout=subprocess.PIPE,
                                      text=True) for _ in range(count)]
        outputs = [p.communicate()[0] for p in processes]
        if any(p.returncode for p in processes):
            raise SystemExit(f"a process could not open a CUDA context (exit {max(p.returncode for p in processes)})")
        results = [json.loads(out.splitlines()[-1]) for out in outputs]
        seconds = sorted(took for took, _ in results)
        late = sum(not on_time for _, on_time in results)
        print(f"{count:3d} processes at once: a context took {statistics.median(seconds):.2f} s at the median, "
              f"{seconds[-1]:.2f} s the longest" + (f" ({late} came after the instant: not at once)" if late else ""))


if __name__ == "__main__":
    main()
