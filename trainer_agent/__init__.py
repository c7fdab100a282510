"""The trainer library: read a job's data from its master, checkpoint, run under a launcher.

    from trainer_agent import TaskClient, MasterDataset, save_checkpoint, load_checkpoint, TrainStatus

`TaskClient` (and `Epoch`, its errors) is the master's client; `save_checkpoint`,
`load_checkpoint`, `latest_train_status` and `TrainStatus` the checkpoints;
`MasterDataset`, `join_batches` and the Paddle checkpoint helpers the PaddlePaddle
integration (`trainer_agent.paddle`).

Importing this package does NOT import PaddlePaddle (a second of start-up, and not
installed where only the client is needed): the Paddle names are looked up on first
use, which imports `trainer_agent.paddle` then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainer_agent.checkpoint import (
    TrainStatus,
    latest_train_status,
    load_checkpoint,
    save_checkpoint,
)
from trainer_agent.client import (
    AllTasksFailed,
    Epoch,
    MasterUnavailable,
    TaskClient,
    TrainerSuperseded,
)

if TYPE_CHECKING:
    from trainer_agent.paddle import (
        MasterDataset,
        all_reduce_sum,
        join_batches,
        load_paddle_checkpoint,
        save_paddle_checkpoint,
    )

_PADDLE_NAMES = ("MasterDataset", "join_batches", "all_reduce_sum", "save_paddle_checkpoint",
                 "load_paddle_checkpoint")

__all__ = [
    "AllTasksFailed", "Epoch", "MasterUnavailable", "TaskClient", "TrainerSuperseded",
    "TrainStatus", "latest_train_status", "load_checkpoint", "save_checkpoint",
    "MasterDataset", "join_batches", "all_reduce_sum", "save_paddle_checkpoint",
    "load_paddle_checkpoint",
]


def __getattr__(name: str) -> Any:
    if name in _PADDLE_NAMES:
        return getattr(importlib.import_module("trainer_agent.paddle"), name)
    raise AttributeError(f"module 'trainer_agent' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
