"""Start the tiny LLM one of three ways, then serve a few greedy requests; the log names each phase.

    python -m examples.tiny_llm [--start buildops|warmup|lazy] [--size base|small] [--checkpoint PATH]

    buildops  start the build workers (before importing torch) -> create the model (its GEMM builds queue from
              the configuration, before the allocation) -> dummy weights -> rehearsal (a context batch at the
              maximum token count, one decode step) with the checkpoint's load begun beside it, the builds
              running meanwhile -> join the GPU builds -> one short real request (``TinyLlm.warm_request``), so
              that the first request does not pay what a process does once -> collect the garbage and freeze
              the heap -> serve. ``--load-after-rehearsal`` begins the load once the rehearsal is done, for
              comparison: slower in 7 of 8 runs while the rehearsal took seconds, within the noise since it
              takes 0.15 s. ``--no-warm-request`` leaves the warm request out, for comparison
              (docs/benchmarks.md)
    warmup    create -> load -> the same two forwards for real, one kernel compile after another -> serve
    lazy      create -> load -> serve (every kernel compiles in the first requests)

Run from the repository root. ``--json FILE`` writes the timings, the tokens and the compiles seen while serving,
for ``benchmarks/startup.py``; the checkpoint is made first if it does not exist.
"""

from __future__ import annotations

import threading
import time

LAUNCHED = time.perf_counter()  # before the imports: they are part of a start

import argparse  # noqa: E402
import sys  # noqa: E402

from buildops.startup import phase, phases, rehearse_then_load, start_build_workers  # noqa: E402 - no torch yet


def starts_with_buildops(argv: list[str]) -> bool:
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--start", default="buildops")
    return early.parse_known_args(argv)[0].start == "buildops"


if __name__ == "__main__" and starts_with_buildops(sys.argv[1:]):
    # Before torch is imported: the build workers' forkserver imports torch and Triton beside this process's own
    # imports (seconds each on some hosts), not after them.
    start_build_workers()

import json  # noqa: E402
import logging  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import buildops  # noqa: E402

from . import kernels as K  # noqa: E402
from .checkpoint import load_checkpoint, make_checkpoint  # noqa: E402
from .family import TinyLlmGemms  # noqa: E402
from .model import SIZES, TinyLlm, reference_logits  # noqa: E402

PROMPT_LENGTHS = (23, 100, 7, 61)  # none a power of two: serving sees token counts a rehearsal never ran
logger = logging.getLogger("tiny_llm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", choices=("buildops", "warmup", "lazy"), default="buildops")
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--checkpoint", help="safetensors file (default: <tmp>/buildops-tiny-llm/<size>.safetensors)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--load-after-rehearsal", action="store_true",
                        help="buildops start that begins the load once the rehearsal is done, not beside it "
                             "(see rehearse_then_load)")
    parser.add_argument("--no-family", action="store_true",
                        help="buildops start without the GEMM family: the rehearsal lists everything")
    parser.add_argument("--warm-request", action=argparse.BooleanOptionalAction,
                        help="buildops start that ends with one short real request (rehearse_then_load's warm), "
                             "so that the first request does not pay what is done once per process (the default "
                             "of a buildops start)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.warm_request and args.start != "buildops":
        parser.error("--warm-request is a step of the buildops start")
    if args.warm_request is None:
        args.warm_request = args.start == "buildops"
    return args


def prompts(config) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(config.vocab, (min(n, config.max_tokens),), generator=generator).tolist()
            for n in PROMPT_LENGTHS]


def start(how: str, model_config, checkpoint: Path, device: str, family: bool = True,
          overlap: bool = True, warm: bool = False) -> TinyLlm:
    if how == "buildops":
        with phase("create model"):
            if family:
                buildops.register_family(TinyLlmGemms())
                buildops.model_configured(model_config)
            model = TinyLlm(model_config, device)
        with phase("dummy weights"):
            model.dummy_weights()
        # The heap frozen once started, as vLLM's engine does: the model lives as long as the process.
        rehearse_then_load(model.rehearse, lambda: load_checkpoint(model, checkpoint), overlap=overlap,
                           freeze_heap=True, warm=model.warm_request if warm else None)
        return model
    with phase("create model"):
        model = TinyLlm(model_config, device)
    with phase("load"):
        load_checkpoint(model, checkpoint)
    if how == "warmup":
        with phase("warmup forwards"):
            model.rehearse()
            synchronize(model.device)
    return model


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_compiles() -> list[str]:
    """From now on, every Triton compile (or disk-cache load) on this thread, the one that serves, is appended to
    the list. Builds still running behind serving (the rest of a sweep) compile on buildops' threads: not counted."""
    from triton import knobs

    serving = threading.current_thread()
    seen: list[str] = []
    previous = knobs.runtime.jit_post_compile_hook

    def hook(**kwargs):
        if threading.current_thread() is serving:
            seen.append(kwargs["fn"].name)
        return previous(**kwargs) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = hook
    return seen


def count_tunings() -> list[str]:
    """From now on, every autotuning on this thread is appended to the list (by the kernel's name); those that
    buildops runs behind serving are not."""
    from triton.runtime.autotuner import Autotuner

    serving = threading.current_thread()
    seen: list[str] = []
    prune = Autotuner.prune_configs  # called once per tuning, just before its timings

    def counting(self, *args, **kwargs):
        if threading.current_thread() is serving:
            seen.append(getattr(self.fn, "__name__", repr(self.fn)))
        return prune(self, *args, **kwargs)

    Autotuner.prune_configs = counting
    return seen


def build_seconds() -> tuple[float, float]:
    """Seconds the builds spent compiling and autotuning (not counting a tune's wait for the compiles it times)."""
    builds = buildops.report().builds
    compiling = sum(b.seconds for b in builds if b.build.library == "triton" and not b.build.serial)
    tuning = sum(b.seconds - b.waited for b in builds if b.build.serial)
    return compiling, tuning


def main() -> None:
    args = parse_args()
    launched = LAUNCHED
    imported = time.perf_counter() - launched
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0f ms  %(message)s")
    config = SIZES[args.size]
    checkpoint = Path(args.checkpoint or Path(tempfile.gettempdir()) / "buildops-tiny-llm" / f"{args.size}.safetensors")
    if not checkpoint.exists():
        started = time.perf_counter()
        make_checkpoint(checkpoint, config)
        made = time.perf_counter() - started
        logger.info("made %s (%.1f GB) in %.1f s", checkpoint, checkpoint.stat().st_size / 1e9, made)
        launched += made  # making the checkpoint is not part of a start

    model = start(args.start, config, checkpoint, args.device, family=not args.no_family,
                  overlap=not args.load_after_rehearsal, warm=args.warm_request)
    synchronize(model.device)
    ready = time.perf_counter() - launched
    logger.info("ready to serve after %.2f s (%s start)", ready, args.start)

    compiles = count_compiles()
    tunings = count_tunings()
    requests = prompts(config)
    latencies, tokens = [], []
    for prompt in requests:
        begun = time.perf_counter()
        tokens.append(model.generate(prompt, args.new_tokens))
        latencies.append(time.perf_counter() - begun)
        logger.info("request of %d tokens: %.1f ms, %s", len(prompt), latencies[-1] * 1e3, tokens[-1])
    serving_compiles = list(compiles)
    tuned_while_serving = len(tunings)  # autotuning on first use
    steady = []
    for _ in range(5):  # the first request again, with everything compiled and tuned: the steady state
        begun = time.perf_counter()
        model.generate(requests[0], args.new_tokens)
        steady.append(time.perf_counter() - begun)

    ids = torch.tensor(requests[0], dtype=torch.int32, device=model.device)
    expected = reference_logits(model, ids)
    error = ((model(ids, 0) - expected).abs().max() / expected.abs().max()).item()
    logger.info("first request %.1f ms, steady %.1f ms; %d compile(s) and %d autotuning(s) while serving; logits "
                "within %.1e of torch", latencies[0] * 1e3, min(steady) * 1e3, len(serving_compiles),
                tuned_while_serving, error)
    if args.start == "buildops":
        logger.info("buildops report:\n%s", buildops.report().format())
    result = {
        "start": args.start, "ready_s": ready, "imports_s": imported, "phases": phases(),
        "first_request_s": latencies[0],
        "request_s": latencies, "steady_request_s": min(steady),
        "steady_request_median_s": sorted(steady)[len(steady) // 2], "serving_compiles": serving_compiles,
        "late_compiles": len(buildops.late_compiles()), "tokens": tokens, "reference_error": error,
        "builds": buildops.report().total("built"), "build_failures": buildops.report().total("failed"),
        "build_seconds": sum(build_seconds()),
        "tune_seconds": build_seconds()[1], "tuned_while_serving": tuned_while_serving,
        "tuned": {str(key): str(config) for key, config in K._matmul_kernel.cache.items()},
        "fetched_from_store": sum(record.origin == "store" for record in buildops.report().builds),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    buildops.shutdown()


if __name__ == "__main__":
    main()
