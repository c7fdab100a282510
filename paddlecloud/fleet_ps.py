"""Paddle's fleet PS in a program that paddlecloud restarts: trainer 0 must not reset the model.

On Paddle's fleet PS (async mode) trainer 0 pushes its freshly initialised dense parameters to
the pservers in `fleet.init_worker()`, and every trainer then pulls them: right at a job's start,
wrong when trainer 0 was restarted (measured on 2.6.2: the other trainer's loss jumps from 0.44
back to 18.5). The trainer launcher knows whether the pservers hold a trained model already
(the master's epoch or done count shows progress): it then sets `PADDLECLOUD_PS_MODEL_LIVE=1`,
and `init_worker(fleet)` here makes trainer 0 pull the dense parameters like the others instead
of pushing its own. Call it in place of `fleet.init_worker()`.

Nothing here imports paddlecloud's gRPC code (this runs on Paddle 2.6.2, protobuf 4); Paddle itself
is the caller's `fleet` module.

What this does NOT cover: geo mode (`a_sync_configs.k_steps`), where every trainer's
communicator initialises its own copy (`GeoCommunicator.init_params`) and a restarted geo trainer
hangs in `InitSparse` (measured on 2.6.2), nor the sparse tables, which the pservers create on
first pull and no trainer pushes.
"""

from __future__ import annotations

import os
from typing import Any

MODEL_LIVE_ENV = "PADDLECLOUD_PS_MODEL_LIVE"


def model_live() -> bool:
    """Whether the launcher said the pservers hold a model already."""
    return os.environ.get(MODEL_LIVE_ENV) == "1"


def init_worker(fleet: Any) -> bool:
    """`fleet.init_worker()`, but without trainer 0's push of fresh dense parameters when the
    pservers hold a model already; returns whether that push was skipped."""
    handle = getattr(getattr(fleet, "fleet", fleet), "_runtime_handle", None)
    if not model_live() or handle is None or not hasattr(handle, "_init_all_params"):
        fleet.init_worker()
        return False
    original = handle._init_all_params
    handle._init_all_params = lambda *args, **kwargs: []  # every trainer pulls, none pushes
    try:
        fleet.init_worker()
    finally:
        handle._init_all_params = original
    return True
