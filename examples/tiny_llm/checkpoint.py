"""The example's checkpoint: a real safetensors file of synthetic weights, made locally, streamed to the model's
device through pinned buffers. The loader takes any module whose parameters the file names (``examples/hf_fla``
loads a transformers model with it), and importing it imports no model."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

if TYPE_CHECKING:
    from .model import Config


def make_checkpoint(path: str | os.PathLike, config: Config, seed: int = 0) -> Path:
    """Write synthetic weights for ``config`` to ``path`` and return the path (see :func:`save_random_weights`)."""
    from .model import TinyLlm

    # The model keeps its matrices as [K, N]: a matrix's fan-in is its first dim.
    return save_random_weights(TinyLlm(config, "meta"), path, config.dtype, repr(config), seed,
                               fan_in=lambda name, shape: 1 if name == "embed" else shape[0])


def save_random_weights(model: torch.nn.Module, path: str | os.PathLike, dtype: torch.dtype, description: str,
                        seed: int, fan_in: Callable[[str, torch.Size], int]) -> Path:
    """Write a safetensors file of random weights for ``model``'s parameters (a model on the meta device will do):
    vectors (norms) 1, matrices ~ N(0, 1/fan_in(name, shape)). Written to a temporary name first, so a crash never
    leaves a partial file; ``description`` goes into the file's metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the same seed gives other values there: fine
    generator = torch.Generator(device).manual_seed(seed)
    tensors = {}
    for name, param in model.named_parameters():
        if param.dim() == 1:
            tensors[name] = torch.ones(param.shape, dtype=dtype)
        else:
            values = torch.randn(param.shape, generator=generator, device=device) * fan_in(name, param.shape) ** -0.5
            tensors[name] = values.to(dtype).cpu()
    partial = path.with_suffix(".partial")
    save_file(tensors, str(partial), metadata={"config": description})
    partial.replace(path)
    return path


@torch.inference_mode()
def load_checkpoint(model: torch.nn.Module, path: str | os.PathLike) -> int:
    """Copy every tensor of the checkpoint into the model's weights (its ``named_parameters()``, on its ``device``),
    in file order, the way engines stream a checkpoint to the GPU; returns the bytes loaded. A missing name, or a
    shape or dtype that does not match, is an error naming the tensor.

    On a GPU it reads the file in chunks into a few pinned buffers and copies each to the GPU on a stream of its
    own while the next chunk is read. Builds run beside a load, and this is what lets them: a file read releases
    the GIL, and an asynchronous pinned copy keeps a device-wide synchronize (an autotuner's ``do_bench`` does
    several per config) from waiting for more than the chunks in flight. Synchronous copies from pageable memory
    (``safe_open(...).get_tensor`` then ``copy_``) made 30 ``do_bench`` calls 10x slower on the H200 host
    (``benchmarks/tuning_contention.py``).
    """
    params = dict(model.named_parameters())
    with open(path, "rb", buffering=0) as file:
        entries, data_start = _read_header(file, path)
        missing = set(params) - set(entries)
        if missing:
            raise ValueError(f"{path}: the checkpoint lacks {sorted(missing)[:5]}; was it made for another size?")
        for name, (dtype, shape, _begin, _end) in entries.items():
            param = params.get(name)
            if param is not None and (shape != tuple(param.shape) or dtype != param.dtype):
                raise ValueError(f"{path}: {name} is {dtype} {shape}, the model wants {param.dtype} "
                                 f"{tuple(param.shape)}; was it made for another size?")
        if hasattr(os, "posix_fadvise"):  # a larger read-ahead: the file is read once, front to back
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        order = sorted((begin, end, name) for name, (_d, _s, begin, end) in entries.items() if name in params)
        streaming = _ChunkedCopy(model.device) if model.device.type == "cuda" else None
        loaded = 0
        for begin, end, name in order:
            destination = params[name].view(-1).view(torch.uint8)
            file.seek(data_start + begin)
            if streaming is None:
                _read_exactly(file, destination.numpy(), path)
            else:
                streaming.copy(file, destination, path)
            loaded += end - begin
        if streaming is not None:
            streaming.finish()
    return loaded


_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def _read_header(file, path) -> tuple[dict[str, tuple[torch.dtype, tuple[int, ...], int, int]], int]:
    """The safetensors header: a little-endian u64 length, then JSON mapping each name to its dtype, shape and
    byte range in the data that follows. Read here rather than through ``safe_open``, which hands out tensors but
    not where they lie in the file."""
    raw = {}
    try:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
        header.pop("__metadata__", None)
        for name, info in header.items():
            begin, end = info["data_offsets"]
            raw[name] = (info["dtype"], tuple(info["shape"]), begin, end)
    except (struct.error, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a safetensors file, or its header is damaged ({exc!r})") from exc
    entries = {}
    for name, (dtype, shape, begin, end) in raw.items():
        if dtype not in _DTYPES:
            raise ValueError(f"{path}: {name} has dtype {dtype}, which this loader does not read")
        nbytes = math.prod(shape) * _DTYPES[dtype].itemsize
        if end - begin != nbytes:
            raise ValueError(f"{path}: {name} ({dtype} {shape}) spans {end - begin} bytes in the file, not "
                             f"{nbytes}; the header is damaged")
        entries[name] = (_DTYPES[dtype], shape, begin, end)
    return entries, 8 + length


def _read_exactly(file, into, path) -> None:
    view = memoryview(into).cast("B")
    while view:
        n = file.readinto(view)
        if not n:
            raise ValueError(f"{path}: the file ends early; was it written completely?")
        view = view[n:]


class _ChunkedCopy:
    """File -> pinned buffer -> GPU, chunk by chunk, with a few buffers in flight on a stream of its own."""

    # Each chunk costs a few GIL hand-backs (read, copy, event), each a wait beside Python-busy threads: 8 MiB
    # chunks made the load 20% slower beside the rehearsal. A device-wide synchronize waits ~1 ms at most for
    # one in flight, and the copy engine is idle most of the time: the disk is ten times slower than the copy.
    CHUNK = 32 << 20
    BUFFERS = 3

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device)
        # Torch's streams do not wait for the default stream: without this, a write to the weights still queued
        # there (the dummy weights' fill) could land after the checkpoint's copy and overwrite it.
        self.stream.wait_stream(torch.cuda.current_stream(device))
        self.buffers = [torch.empty(self.CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(self.BUFFERS)]
        self.done: list[torch.cuda.Event | None] = [None] * self.BUFFERS
        self.next = 0

    def copy(self, file, destination: torch.Tensor, path) -> None:
        for start in range(0, destination.numel(), self.CHUNK):
            size = min(self.CHUNK, destination.numel() - start)
            slot = self.next
            self.next = (slot + 1) % self.BUFFERS
            if self.done[slot] is not None:
                self.done[slot].synchronize()  # the copy that last used this buffer is done with it
            buffer = self.buffers[slot][:size]
            _read_exactly(file, buffer.numpy(), path)
            with torch.cuda.stream(self.stream):
                destination[start:start + size].copy_(buffer, non_blocking=True)
                self.done[slot] = self.stream.record_event()

    def finish(self) -> None:
        self.stream.synchronize()
