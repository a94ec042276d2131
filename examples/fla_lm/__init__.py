"""A small language model built from flash-linear-attention's Triton kernels (``fla-core``), with buildops
decorating those kernels' ops from outside: no line of ``fla`` changes."""
