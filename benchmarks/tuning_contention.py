"""What slows autotuning during a startup: Triton's ``do_bench`` on one thread (as a tune runs it, on the tiny
LLM's decode GEMM, 2 ms warmup and 10 ms of repeats) while another thread

    idles;
    copies 50 MiB CPU tensors to the GPU, from pageable memory (as a checkpoint load does) or from pinned memory;
    copies 32 MiB pinned chunks asynchronously on a stream of its own, 3 in flight (as the tiny LLM's loader
    does, here back to back, with no file read between them);
    runs Python (as a rehearsal's replays do); and that again with buildops' shorter GIL switch interval
    (``buildops._runtime.gil``, held while builds are in flight).

    python3 benchmarks/tuning_contention.py

GPU only; run from the repository root.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from buildops._runtime.gil import holding as short_switch_interval

from examples.tiny_llm import kernels as K

CALLS = 30


def main() -> None:
    x = torch.randn(16, 3072, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3072, 3072, device="cuda", dtype=torch.bfloat16)
    K.matmul(x, w)  # compiled and tuned once, before anything is timed
    torch.cuda.synchronize()
    pageable = [torch.empty(50 * 2**20, dtype=torch.uint8) for _ in range(4)]
    pinned = [t.pin_memory() for t in pageable]
    target = torch.empty(50 * 2**20, dtype=torch.uint8, device="cuda")
    chunks = [torch.empty(32 * 2**20, dtype=torch.uint8, pin_memory=True) for _ in range(3)]
    stream = torch.cuda.Stream()
    done: list = [None] * 3

    def beside(what: str, stop: threading.Event) -> None:
        i = 0
        while not stop.is_set():
            if what == "pageable copies":
                target.copy_(pageable[i % 4])
            elif what == "pinned copies":
                target.copy_(pinned[i % 4])
            elif what == "pinned chunks, own stream":
                if done[i % 3] is not None:
                    done[i % 3].synchronize()
                with torch.cuda.stream(stream):
                    target[:chunks[0].numel()].copy_(chunks[i % 3], non_blocking=True)
                    done[i % 3] = stream.record_event()
            else:
                sum(range(1000))
            i += 1

    def tune() -> float:
        start = time.perf_counter()
        for _ in range(CALLS):
            triton.testing.do_bench(lambda: K.matmul(x, w), warmup=2, rep=10)
        return time.perf_counter() - start

    tune()
    print(f"{CALLS} do_bench calls, {torch.cuda.get_device_name()}, triton {triton.__version__}")
    print(f"{'beside':40} {'s':>6}")
    for what, interval in (("nothing", None), ("pageable copies", None), ("pinned copies", None),
                           ("pinned chunks, own stream", None), ("Python", None), ("Python", short_switch_interval),
                           ("nothing", None)):
        stop = threading.Event()
        other = threading.Thread(target=beside, args=(what, stop)) if what != "nothing" else None
        if other is not None:
            other.start()
        with interval() if interval is not None else contextlib.nullcontext():
            seconds = tune()
        stop.set()
        if other is not None:
            other.join()
        label = what + (", buildops' switch interval" if interval is not None else "")
        print(f"{label:40} {seconds:6.2f}")


if __name__ == "__main__":
    main()
