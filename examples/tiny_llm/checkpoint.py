"""The example's checkpoint: a real safetensors file of synthetic weights, made locally, loaded tensor by tensor."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .model import Config, TinyLlm


def make_checkpoint(path: str | os.PathLike, config: Config, seed: int = 0) -> Path:
    """Write synthetic weights for ``config`` to ``path`` (norms 1, matrices ~ N(0, 1/fan_in), the embedding
    N(0, 1)) and return the path. Written to a temporary name first, so a crash never leaves a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the same seed gives other values there: fine
    generator = torch.Generator(device).manual_seed(seed)
    model = TinyLlm(config, "meta")
    tensors = {}
    for name, param in model.named_parameters():
        if param.dim() == 1:
            tensors[name] = torch.ones(param.shape, dtype=config.dtype)
        else:
            std = 1.0 if name == "embed" else param.shape[0] ** -0.5
            values = torch.randn(param.shape, generator=generator, device=device) * std
            tensors[name] = values.to(config.dtype).cpu()
    partial = path.with_suffix(".partial")
    save_file(tensors, str(partial), metadata={"config": repr(config)})
    partial.replace(path)
    return path


@torch.inference_mode()
def load_checkpoint(model: TinyLlm, path: str | os.PathLike) -> int:
    """Copy every tensor of the checkpoint into the model's weights, one at a time, the way engines stream a
    checkpoint to the GPU; returns the bytes loaded. A name or shape that does not match is an error."""
    params = dict(model.named_parameters())
    loaded = 0
    with safe_open(str(path), framework="pt", device="cpu") as f:
        missing = set(params) - set(f.keys())
        if missing:
            raise ValueError(f"{path}: the checkpoint lacks {sorted(missing)[:5]}; was it made for another size?")
        for name in f.keys():
            tensor = f.get_tensor(name)
            param = params[name]
            if tensor.shape != param.shape:
                raise ValueError(f"{path}: {name} has shape {tuple(tensor.shape)}, the model wants "
                                 f"{tuple(param.shape)}; was it made for another size?")
            param.copy_(tensor, non_blocking=False)
            loaded += tensor.numel() * tensor.element_size()
    return loaded
