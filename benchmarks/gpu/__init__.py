"""GPU benchmarks, profiles and the H200 run scripts (``python -m benchmarks.gpu.X``, ``bash benchmarks/gpu/X.sh``
from the checkout's root). The GPU tests are in ``tests/gpu``; some scripts reuse its helpers."""
