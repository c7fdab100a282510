"""paddlecloud: fault-tolerant, elastic PaddlePaddle training on Kubernetes.

`from paddlecloud import PaddleJob, dist_train` is the Python API (`paddlecloud.sdk`).
It loads on first use (PEP 562), so the many processes that import a
`paddlecloud.*` module (masters, trainers, the CLI) do not pay for it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PaddleJob", "dist_train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from paddlecloud import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'paddlecloud' has no attribute {name!r}")
