"""Start the model one of three ways, serve a trace of requests, replay the trace warm, and print one JSON line.

    python -m examples.hf_fla [--start buildops|warmup|lazy] [--size base|small] [--no-load] [--requests 24]

    buildops  start the build workers (before importing torch) -> create the model (dummy weights) -> rehearsal (a
              prefill of the most tokens, a decode step) with the checkpoint's load begun beside it -> join the GPU
              builds -> serve
    warmup    create -> load -> a forward per warmup shape, one compile after another (as vLLM warms up) -> serve
    lazy      create -> load -> serve: every kernel compiles (and autotunes) in the first request that needs it

``warmup`` and ``lazy`` run without buildops (``BUILDOPS=0`` unless the environment sets it). ``BUILDOPS_EXECUTOR``
picks where buildops' Triton builds compile. The checkpoint (random weights, safetensors) is made first if it does
not exist; ``--make-checkpoint`` only makes it. Run from the repository root, on a GPU.

The JSON line: wall-clock stamps (``time.time()``) of the launch, the end of the imports, ready, the first
request's end and the trace's end; each request's seconds, cold and warm (the trace replayed once everything has
compiled); Triton compiles while serving (on the serving thread, and on others); buildops' late compiles and builds.
"""

from __future__ import annotations

import time

LAUNCHED = time.time()  # before the imports: they are part of a start

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from buildops.startup import phase, phases, start_build_workers  # noqa: E402 - no torch yet


def starts_with_buildops(argv: list[str]) -> bool:
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--start", default="buildops")
    return early.parse_known_args(argv)[0].start == "buildops"


if __name__ == "__main__":
    if starts_with_buildops(sys.argv[1:]):
        # Before torch is imported: the workers' forkserver imports torch and Triton beside this process's imports.
        start_build_workers()
    else:
        os.environ.setdefault("BUILDOPS", "0")  # read when the ops are decorated, on import

import hashlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import buildops  # noqa: E402

from .engine import STARTS, CompileCounter, default_checkpoint, make_trace, serve, start_engine, synchronize  # noqa: E402
from .model import SIZES, make_checkpoint  # noqa: E402
from .ops import reference_ops  # noqa: E402

IMPORTED = time.time()
logger = logging.getLogger("hf_fla")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", choices=STARTS, default="buildops")
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--checkpoint", type=Path, help="safetensors file (default: <tmp>/buildops-hf-fla/SIZE...)")
    parser.add_argument("--no-load", action="store_true", help="serve on dummy weights: no checkpoint load")
    parser.add_argument("--requests", type=int, default=24, help="requests in the trace")
    parser.add_argument("--seed", type=int, default=0, help="the trace's seed")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--reference-ops", action="store_true",
                        help="plain torch in place of fla's kernels: checks the wiring on a machine without a GPU")
    parser.add_argument("--make-checkpoint", action="store_true", help="make the checkpoint, then exit")
    parser.add_argument("--imports-only", action="store_true", help="exit once imported (primes bytecode caches)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.imports_only:
        return
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0f ms  %(message)s")
    warnings.filterwarnings("ignore", message="Triton is not supported on current platform")  # fla, on a CPU
    config = SIZES[args.size]
    checkpoint = args.checkpoint or default_checkpoint(args.size)
    if args.make_checkpoint or (not args.no_load and not checkpoint.exists()):
        with phase("make checkpoint"):  # not part of a start: the benchmark makes it beforehand
            make_checkpoint(checkpoint, config)
        logger.info("made %s (%.2f GB)", checkpoint, checkpoint.stat().st_size / 1e9)
        if args.make_checkpoint:
            return
    trace = make_trace(config, args.requests, args.seed)
    compiles = CompileCounter()  # before buildops first patches Triton's listener

    ops = reference_ops() if args.reference_ops else None
    model, load_seconds = start_engine(args.start, config, None if args.no_load else checkpoint, args.device, ops)
    synchronize(model.device)
    ready = time.time()
    logger.info("ready to serve after %.2f s (%s start)", ready - LAUNCHED, args.start)

    compiles.start()
    served = serve(model, trace, config.vocab)
    serving_compiles = list(compiles.seen)
    warm = serve(model, trace, config.vocab)  # everything compiled and tuned now: each request's own cost
    stalls = [max(0.0, cold - hot) for cold, hot in zip(served.seconds, warm.seconds)]
    enabled = buildops.settings.enabled
    report = buildops.report() if enabled else None
    result = {
        "start": args.start, "load": not args.no_load, "size": args.size,
        "executor": os.environ.get("BUILDOPS_EXECUTOR", "auto") if enabled else None,
        "launched": LAUNCHED, "imported": IMPORTED, "ready": ready,
        "first_done": served.ended[0], "trace_end": served.ended[-1],
        "request_s": served.seconds, "warm_s": warm.seconds,
        "longest_stall_s": max(stalls), "total_stall_s": sum(stalls),
        "serving_compiles": sum(main for _, main in serving_compiles),
        "background_compiles": sum(not main for _, main in serving_compiles),
        "compiled_kernels": sorted({name for name, main in serving_compiles if main}),
        "late_compiles": len(buildops.late_compiles()) if enabled else None,
        "builds": report.total("built") if report else None,
        "build_failures": report.total("failed") if report else None,
        "load_s": load_seconds, "phases": phases(),
        "tokens": hashlib.sha256(json.dumps(served.tokens).encode()).hexdigest()[:12],
        "tokens_repeat": served.tokens == warm.tokens,
    }
    if report is not None:
        logger.info("buildops report:\n%s", report.format())
    print(json.dumps(result), flush=True)
    buildops.shutdown()


if __name__ == "__main__":
    main()
