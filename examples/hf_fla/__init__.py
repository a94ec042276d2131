"""A small Hugging Face ``transformers`` model (Llama, made from a configuration in code) whose norms, MLP activation
and rotary embedding are flash-linear-attention's Triton kernels (``fla-core``), decorated with buildops from
outside: no line of ``fla`` or ``transformers`` changes. ``benchmarks/real_start.py`` starts it several ways."""
