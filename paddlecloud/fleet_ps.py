"""Paddle's fleet PS in a program that paddlecloud restarts: trainer 0 must not reset the model.

On Paddle's fleet PS (async mode) trainer 0 pushes its freshly initialised dense parameters to
the pservers in `fleet.init_worker()`, and every trainer then pulls them: right at a job's start,
wrong when trainer 0 was restarted (measured on 2.6.2: the other trainer's loss jumps from 0.44
back to 18.5). The trainer launcher knows whether the pservers hold a trained model already
(the master's epoch or done count shows progress): it then sets `PADDLECLOUD_PS_MODEL_LIVE=1`,
and `init_worker(fleet)` here makes trainer 0 pull the dense parameters like the others instead
of pushing its own. Call it in place of `fleet.init_worker()`.

`save_checkpoint(fleet, exe, ...)` (trainer 0, at an epoch's end) has the pservers save their
tables (`fleet.save_persistables`) and records them as a checkpoint of paddlecloud's format
(`paddlecloud.checkpoints`: `checkpoint-<epoch>/meta.json` and `state.pkl`), so a PS group
restart resumes the master's epoch after it; `restore(fleet)` (trainer 0, after
`init_worker`, when told `PADDLECLOUD_PSERVER_RESTORE=1`) loads the newest one into the fresh
pservers (`fleet.load_model`).

Under gloo (`PADDLE_WITH_GLOO` 1 or 2) Paddle's `fleet.save_persistables` and `fleet.load_model`
are collectives of the trainers (each starts and ends with `fleet.util.barrier()`, which waits
for every trainer): there every trainer calls `save_checkpoint` and `restore` (`gloo_trainers()`
says when), trainer 0 alone writes the checkpoint's record.

Nothing here imports paddlecloud's gRPC code (this runs on Paddle 2.6.2, protobuf 4); Paddle itself
is the caller's `fleet` module.

What this does NOT cover: geo mode (`a_sync_configs.k_steps`), where every trainer's
communicator initialises its own copy (`GeoCommunicator.init_params`) and a restarted geo trainer
hangs in `InitSparse` (measured on 2.6.2), nor the sparse tables, which the pservers create on
first pull and no trainer pushes.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

MODEL_LIVE_ENV = "PADDLECLOUD_PS_MODEL_LIVE"
RESTORE_ENV = "PADDLECLOUD_PSERVER_RESTORE"  # = paddlecloud.deployer.PSERVER_RESTORE_ENV
# paddlecloud.checkpoints' format, written here without its fsspec (not in a Paddle 2.6.2 venv);
# tests/test_fleet_ps.py checks they agree
CHECKPOINTS_DIR, STATE_FILE, META_FILE, FORMAT_VERSION = "checkpoints", "state.pkl", "meta.json", 1
TABLES_DIR = "ps-tables"


def model_live() -> bool:
    """Whether the launcher said the pservers hold a model already."""
    return os.environ.get(MODEL_LIVE_ENV) == "1"


def gloo_trainers() -> bool:
    """Whether Paddle joins the trainers in one gloo world (`PADDLE_WITH_GLOO` 1 or 2), where
    saving and loading the pservers' tables takes every trainer."""
    return os.environ.get("PADDLE_WITH_GLOO", "0").strip() in ("1", "2")


def _first_trainer() -> bool:
    return os.environ.get("PADDLE_TRAINER_ID", "0") == "0"


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


def save_checkpoint(fleet: Any, executor: Any, *, output: str, epoch: int,
                    keep: int = 2) -> Path | None:
    """Trainer 0 at the end of `epoch` (every trainer under gloo): the pservers save their
    tables under `output/ps-tables/epoch-N`, then trainer 0 names them
    `output/checkpoints/checkpoint-N` (written in a temporary directory and renamed: a
    checkpoint is whole or absent) and returns its path; another trainer returns None."""
    tables = Path(output, TABLES_DIR, f"epoch-{epoch:08d}")
    first = _first_trainer()
    if first:
        shutil.rmtree(tables, ignore_errors=True)
    fleet.save_persistables(executor, str(tables))  # each pserver writes its shard there
    if not first:
        return None
    state = pickle.dumps({"ps_tables": str(tables)})
    checkpoints = Path(output, CHECKPOINTS_DIR)
    tmp = checkpoints / f".tmp-{time.time_ns()}-{os.getpid()}"
    tmp.mkdir(parents=True)
    (tmp / STATE_FILE).write_bytes(state)
    (tmp / META_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION, "epoch": epoch,
                                             "time": time.time(), "state_bytes": len(state)}))
    final = checkpoints / f"checkpoint-{epoch:08d}"
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(checkpoints.glob("checkpoint-*"))[:-keep]:
        shutil.rmtree(Path(output, TABLES_DIR, "epoch-" + old.name.split("-", 1)[1]), ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return final


def newest_tables(output: str) -> tuple[int, str] | None:
    """(epoch, tables directory) of the newest whole checkpoint under `output`, else None."""
    for version in sorted(Path(output, CHECKPOINTS_DIR).glob("checkpoint-*"), reverse=True):
        try:
            meta = json.loads((version / META_FILE).read_text())
            state = pickle.loads((version / STATE_FILE).read_bytes())
        except (OSError, ValueError, pickle.UnpicklingError):
            continue  # torn: an older one stands
        if isinstance(state, dict) and "ps_tables" in state and Path(state["ps_tables"]).is_dir():
            return int(meta["epoch"]), state["ps_tables"]
    return None


def restore(fleet: Any, *, output: str) -> int | None:
    """Trainer 0 (every trainer under gloo), after `init_worker`, told to restore: loads the
    newest checkpoint's tables into the pservers; returns its epoch (None: nothing to restore,
    or not told to)."""
    if os.environ.get(RESTORE_ENV) != "1":
        return None
    found = newest_tables(output)
    if found is None:
        return None
    epoch, tables = found
    fleet.load_model(tables, 0)
    return epoch
