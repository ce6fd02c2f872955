"""AttentionBackendEnum: backend names mapped to lazily imported class paths (design §2).

Importing this module imports no kernel library: a class path is imported only when a backend is used.
"""

from __future__ import annotations

import enum
import importlib


class AttentionBackendEnum(enum.Enum):
    """The attention backends users name with ``--attention-backend`` (vLLM's enum names)."""

    FLASH_ATTN = "attnserve.attention.backends.flash_attn.FlashAttentionBackend"
    FLASHINFER = "attnserve.attention.backends.flashinfer.FlashInferBackend"
    TRITON_ATTN = "attnserve.attention.backends.triton_attn.TritonAttentionBackend"
    FLEX_ATTENTION = "attnserve.attention.backends.flex_attention.FlexAttentionBackend"
    CPU_ATTN = "attnserve.attention.backends.cpu_attn.CPUAttentionBackend"
    CUSTOM = ""

    def get_path(self) -> str:
        """The class path this member resolves to."""
        return self.value

    def get_class(self):
        """Import and return the backend class (raises ImportError when its module is missing)."""
        path = self.get_path()
        if not path:
            raise ValueError(f"attention backend {self.name} has no class registered; use register_backend")
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)
