"""attnserve's own GPU kernels, each next to its PyTorch definition.

Every op has a dispatch module that runs the Triton kernel on CUDA tensors and the plain-PyTorch
definition everywhere else (and on CUDA when Triton is missing); the ``triton_*`` modules hold the kernels
and import Triton, so only the dispatch modules (and the GEMV plan, which times the kernels) import them,
lazily. ``import attnserve`` imports no kernel library.

- ``fused_ops``: RMSNorm (+ residual add), RoPE (+ Qwen3's q/k norm, + the KV-cache write), SwiGLU;
  kernels in ``triton_fused_ops`` and ``triton_rope`` (whose per-token work TRITON_ATTN's decode kernel also
  does inside itself). ``RopeInputs``: the tensors RoPE takes.
- ``kv_write``: new K/V into the paged KV cache (``KVWriteTarget``); kernel in ``triton_kv_write``.
- ``paged_kv_indices``: FlashInfer's page arrays from a step's block table; kernel in
  ``triton_paged_kv_indices``.
- ``triton_attention``: TRITON_ATTN's paged attention; its definition is ``reference.py`` (the oracle
  every attention backend is tested against); ``attention_tiles``: how it cuts a step into tiles (plain
  Python); ``triton_merge_splits``: the merge of its split-KV partial results.
- ``argmax``: row-wise argmax (greedy sampling); kernel in ``triton_argmax``.
- ``grammar_bitmask``: a structured-output step's token bitmask applied to the logits; kernel in
  ``triton_grammar_bitmask`` (the fused greedy head applies it inside itself, ``MASKED``).
- ``triton_gemv`` (its launch configurations in ``triton_gemv_config``), ``triton_greedy_head``: the
  skinny-GEMM GEMV and the fused greedy LM head; their definitions are ``F.linear`` and
  ``argmax(F.linear(...))`` (with a grammar bitmask: ``grammar_bitmask`` first), and the GEMV plan (``attnserve/gemv``) uses them only where they measure faster
  and agree with those.
- ``triton_common``: what every kernel shares (numerics switches, rounding, ticket counters);
  ``pdl``: the programmatic-dependent-launch switch.

This package is a leaf: it imports nothing else of attnserve (a test checks it).
"""
