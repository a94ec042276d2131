"""The engine: start the model one of three ways, then serve a trace of requests.

A request is a batch of ``batch`` sequences of one prompt length, prefilled in one forward, then decoded together,
one token per step, greedily, with transformers' KV cache.
"""

from __future__ import annotations

import gc
import random
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from buildops.startup import phase, rehearse_then_load

from .model import Config, create_model, dummy_weights

STARTS = ("buildops", "warmup", "lazy")


@dataclass(frozen=True)
class Request:
    batch: int
    prompt: int
    new_tokens: int
    seed: int

    def ids(self, vocab: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randint(vocab, (self.batch, self.prompt), generator=generator)


def make_trace(config: Config, requests: int = 24, seed: int = 0) -> list[Request]:
    """``requests`` requests, the same for a seed: batches from 1 to ``max_batch``, prompts log-uniform from 1 to
    ``max_prompt`` tokens (one in each of ``requests`` equal steps of the log, then shuffled, so that prompts of
    every scale come, and new token counts keep coming), and a few decode steps each."""
    rng = random.Random(seed)
    top = config.max_prompt.bit_length() - 1  # log2 of the longest prompt
    prompts = [min(config.max_prompt, max(1, round(2 ** (top * (i + rng.random()) / requests))))
               for i in range(requests)]
    rng.shuffle(prompts)
    return [Request(rng.randint(1, config.max_batch), prompt, rng.randint(2, min(6, config.max_new_tokens)),
                    rng.randrange(1 << 30)) for prompt in prompts]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def generate(model, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding of a batch of prompts of one length; returns the new tokens ``[batch, new_tokens]``."""
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(new_tokens - 1):
        out = model(input_ids=tokens[-1], past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
        tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(tokens, dim=1)


def rehearse(model, config: Config) -> None:
    """The dummy forwards of a start: a prefill of the most tokens, then one decode step of the largest batch."""
    ids = torch.zeros(config.max_batch, config.max_prompt, dtype=torch.long, device=model.device)
    generate(model, ids, 2)


def warmup_shapes(config: Config) -> list[tuple[int, int]]:
    """What a serial warmup runs, as vLLM's does for the sizes it supports: a prefill of every power of two of
    tokens up to the most (one sequence up to the longest prompt, then more of the longest), and a decode step of
    each batch size, as (batch, prompt)."""
    shapes, tokens = [], 1
    while tokens < config.max_tokens:
        shapes.append((max(1, tokens // config.max_prompt), min(tokens, config.max_prompt)))
        tokens *= 2
    shapes.append((config.max_batch, config.max_prompt))
    return shapes + [(batch, 1) for batch in range(1, config.max_batch + 1)]


def warmup(model, config: Config) -> None:
    """Run the model once per warmup shape, one after another (each kernel compiles, and autotunes, on its first
    call)."""
    for batch, prompt in warmup_shapes(config):
        generate(model, torch.zeros(batch, prompt, dtype=torch.long, device=model.device), 2)
    synchronize(model.device)


def load(model, checkpoint: Path | None) -> int:
    if checkpoint is None:
        return 0
    from examples.tiny_llm.checkpoint import load_checkpoint

    return load_checkpoint(model, checkpoint)


def start_engine(how: str, config: Config, checkpoint: Path | None, device: str = "cuda",
                 ops: Any = None) -> tuple[Any, float]:
    """Create the model, load ``checkpoint`` (or keep dummy weights, with None), and make it ready to serve; returns
    the model and the seconds its load took.

    - ``buildops``: the startup recipe: dummy forwards in a rehearsal, the load begun beside them, then the GPU
      builds joined (call ``buildops.startup.start_build_workers()`` first thing in the process);
    - ``warmup``: load, then :func:`warmup`, one compile after another;
    - ``lazy``: load; every kernel compiles in the requests that first need it.

    Every start ends with the heap collected and frozen, as vLLM's engine ends its own. ``ops``: as
    :func:`~examples.hf_fla.model.create_model` takes them.
    """
    if how not in STARTS:
        raise ValueError(f"start {how!r}: expected one of {', '.join(STARTS)}")
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(device).index or 0)
    with phase("create model"):
        model = create_model(config, device, ops)
        dummy_weights(model)
    loaded = []

    def timed_load() -> None:  # the load alone: beside a rehearsal, phase "startup: load" spans both
        begun = time.perf_counter()
        load(model, checkpoint)
        synchronize(model.device)
        loaded.append(time.perf_counter() - begun)

    if how == "buildops":
        rehearse_then_load(lambda: rehearse(model, config), timed_load, overlap=True, freeze_heap=True)
        return model, loaded[0]
    with phase("load"):
        timed_load()
    if how == "warmup":
        with phase("warmup forwards"):
            warmup(model, config)
    with phase("collect garbage"):
        gc.collect()
        gc.freeze()
    return model, loaded[0]


@dataclass
class Served:
    seconds: list[float]      # each request, from its start to its last token on the host
    ended: list[float]        # time.time() at each request's end
    tokens: list[list[int]]   # each request's first sequence's new tokens


def serve(model, trace: list[Request], vocab: int) -> Served:
    """Run the trace's requests one after another."""
    served = Served([], [], [])
    for request in trace:
        begun = time.perf_counter()
        ids = request.ids(vocab).to(model.device)
        out = generate(model, ids, request.new_tokens)
        served.tokens.append(out[0].tolist())  # waits for the GPU
        served.seconds.append(time.perf_counter() - begun)
        served.ended.append(time.time())
    return served


class CompileCounter:
    """Counts Triton compiles in this process (not loads from Triton's cache) once :meth:`start` is called, as
    (kernel name, on the main thread), through ``triton.knobs.compilation.listener``, after the listener it found.

    Install it before anything else sets the listener: buildops replaces the listener while its builds compile
    and then restores the one it found, so a listener set meanwhile would be dropped. A build on a buildops thread
    is not the main thread's: only the main thread serves."""

    def __init__(self) -> None:
        from triton import knobs

        self.seen: list[tuple[str, bool]] = []
        self.counting = False
        self.previous = knobs.compilation.listener
        knobs.compilation.listener = self

    def start(self) -> None:
        self.counting = True

    def __call__(self, *, src, metadata, metadata_group, times, cache_hit) -> None:
        if self.counting and not cache_hit:
            self.seen.append((getattr(src, "name", "?"), threading.current_thread() is threading.main_thread()))
        if self.previous is not None:
            self.previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times,
                          cache_hit=cache_hit)


def default_checkpoint(size: str) -> Path:
    return Path(tempfile.gettempdir()) / "buildops-hf-fla" / f"{size}.safetensors"
