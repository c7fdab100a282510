"""Checkpoints of a trainer's state, with the EDL ``TrainStatus`` contract.

``save_checkpoint(path, state, TrainStatus(epoch))`` writes one *version* directory
``<path>/checkpoint-<epoch:08d>`` holding ``state.pkl`` (the state mapping, pickled
with protocol 5) and ``meta.json`` (epoch, time, format version, size of the state),
written in that order into a hidden ``.tmp-<ms>-<hex>`` directory that is renamed
into place only when complete. ``load_checkpoint`` returns the newest complete
version; ``latest_train_status`` reads only its ``meta.json`` so launchers can pass
``--start-epoch = TrainStatus.next()`` cheaply. Reading versions is shared with the
local backend and the master (``paddlecloud.checkpoints``); writing is here.

Paddle users convert tensors with ``.numpy()`` before saving (the Paddle integration
does that); anything picklable works, but unpickling runs code, so only load
checkpoints you wrote.

Guarantees: on local file systems the rename is ``os.replace`` (atomic, then the
directory is fsynced) and on ``memory://`` it is a single in-process move: a process
killed at any point leaves the previous versions loadable, and a half-written
directory is never loaded. Re-saving an existing epoch first moves the old version
aside (``.replaced-...``), where ``load_checkpoint`` still finds it if the process dies
before the new one is in place. Not guaranteed: on object stores (``s3://``, ``gs://``)
a "rename" is a copy; a torn copy is detected (``meta.json`` records the state's size)
and skipped, so a crash there may fall back to an older epoch. One saver per directory
at a time is assumed. "Newest" means the highest epoch, not the latest write.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

from paddlecloud.checkpoints import (  # CheckpointEvery: in the core (the local CLI checks it)
    CHECKPOINT_EVERY_ENV,  # noqa: F401  (this library's API)
    FORMAT_VERSION,
    META_FILE,
    STATE_FILE,
    TASKS_DONE,
    CheckpointDir,
    CheckpointError,
    CheckpointEvery,  # noqa: F401  (this library's API)
    complete_versions,
    versions,
)

logger = logging.getLogger(__name__)

#: A ``.tmp-*`` directory older than this is a dead saver's leftover and gets deleted.
STALE_TMP_SECONDS = 600.0

_TMP = re.compile(r"^\.tmp-(\d+)-[0-9a-f]+$")


@dataclass(frozen=True)
class TrainStatus:
    """The training progress saved with a checkpoint: the last *finished* epoch, or, with
    ``tasks_done``, the epoch in progress and the master's tasks of it the model consumed.

    ``TrainStatus()`` (epoch None) is a start before any epoch finished, as EDL users
    write it: ``next()`` is 0. Only a status with an epoch can be saved.
    ``TrainStatus(3, tasks_done=(7, 2))`` is a checkpoint inside epoch 3: ``next()`` is 3,
    and a group restart resumes epoch 3 with tasks 2 and 7 done (``RestartEpoch``). Saving
    it replaces the epoch's version; the save at the epoch's end (no ``tasks_done``)
    replaces that one in turn.
    """

    epoch: int | None = None
    tasks_done: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.epoch is not None and (isinstance(self.epoch, bool) or not isinstance(self.epoch, int)
                                       or self.epoch < 0):
            raise ValueError(f"invalid TrainStatus epoch {self.epoch!r}: need an int >= 0 (or none)")
        if self.tasks_done is not None:
            if self.epoch is None:
                raise ValueError("TrainStatus tasks_done needs the epoch they belong to")
            if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.tasks_done):
                raise ValueError(f"invalid TrainStatus tasks_done {list(self.tasks_done)[:5]!r}: "
                                 "need task ids >= 0")
            object.__setattr__(self, "tasks_done", tuple(sorted(set(self.tasks_done))))

    @property
    def in_epoch(self) -> bool:
        """Saved inside its epoch (the epoch is not finished)."""
        return self.tasks_done is not None

    def next(self) -> int:
        """The epoch to resume at."""
        if self.epoch is None:
            return 0
        return self.epoch if self.in_epoch else self.epoch + 1


def save_checkpoint(
    path: str, state: Mapping[str, Any], train_status: TrainStatus, *, keep: int = 3
) -> str:
    """Writes a new version under ``path``, keeps the newest ``keep``; returns the version's path.

    Raises CheckpointError naming the directory when writing fails (the previous
    versions are untouched), TypeError/ValueError for bad arguments, and whatever
    pickle raises for an unpicklable state.
    """
    _check_save_args(state, train_status, keep)
    d = CheckpointDir.of(path)
    name = f"checkpoint-{train_status.epoch:08d}"
    tmp = f".tmp-{int(time.time() * 1000)}-{uuid.uuid4().hex}"
    try:
        d.fs.makedirs(d.path(tmp), exist_ok=True)
        size = _write_state(d, d.path(tmp, STATE_FILE), state)
        meta = {
            "format_version": FORMAT_VERSION,
            "epoch": train_status.epoch,
            "time": time.time(),
            "state_bytes": size,
        }
        if train_status.in_epoch:
            meta[TASKS_DONE] = list(train_status.tasks_done)
        _write_bytes(d, d.path(tmp, META_FILE), json.dumps(meta).encode())
        _install(d, tmp, name)
    except OSError as e:
        raise CheckpointError(f"cannot save {d.show(name)}: {e}") from e
    logger.info("saved checkpoint %s (%d bytes of state)", d.show(name), size)
    _prune(d, keep=keep, protect=name)
    return d.show(name)


def load_checkpoint(path: str) -> tuple[dict[str, Any], TrainStatus] | None:
    """The state and TrainStatus of the newest complete version, or None if there is none.

    Raises CheckpointError naming the file when the newest complete version does not
    unpickle (e.g. a class it refers to is gone): it does not silently fall back.
    """
    d = CheckpointDir.of(path)
    found = next(complete_versions(d), None)
    if found is None:
        return None
    entry, meta = found
    try:
        with d.fs.open(d.path(entry.name, STATE_FILE), "rb") as f:
            state = pickle.load(f)
    except Exception as e:
        raise CheckpointError(
            f"cannot load checkpoint {d.show(entry.name, STATE_FILE)}: {type(e).__name__}: {e}"
        ) from e
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{d.show(entry.name, STATE_FILE)} holds a {type(state).__name__}, not a dict"
        )
    return state, _status_of(meta)


def latest_train_status(path: str) -> TrainStatus | None:
    """The TrainStatus of the newest complete version (reads only meta.json), or None."""
    found = next(complete_versions(CheckpointDir.of(path)), None)
    return None if found is None else _status_of(found[1])


def _status_of(meta: Mapping[str, Any]) -> TrainStatus:
    done = meta.get(TASKS_DONE)
    return TrainStatus(int(meta["epoch"]), tasks_done=None if done is None else tuple(done))


# --- writing ---------------------------------------------------------------------------


def _check_save_args(state: Any, train_status: Any, keep: Any) -> None:
    if not isinstance(state, Mapping):
        raise TypeError(f"checkpoint state must be a Mapping, not {type(state).__name__}")
    if not isinstance(train_status, TrainStatus):
        raise TypeError(f"train_status must be a TrainStatus, not {train_status!r}")
    if train_status.epoch is None:
        raise ValueError("cannot save TrainStatus() with no finished epoch: pass TrainStatus(epoch)")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"invalid keep={keep!r}: need an int >= 1")


def _write_state(d: CheckpointDir, file: str, state: Mapping[str, Any]) -> int:
    with d.fs.open(file, "wb") as f:
        pickle.dump(dict(state), f, protocol=5)
        _fsync(d, f)
    return int(d.fs.size(file))


def _write_bytes(d: CheckpointDir, file: str, data: bytes) -> None:
    with d.fs.open(file, "wb") as f:
        f.write(data)
        _fsync(d, f)


def _fsync(d: CheckpointDir, f: Any) -> None:
    """On local disks, flushes ``f`` to stable storage (a power cut must not tear it)."""
    if d.local:
        f.flush()
        os.fsync(f.fileno())


def _install(d: CheckpointDir, tmp: str, name: str) -> None:
    """Renames the complete ``tmp`` to ``name``; an existing version is set aside first."""
    if not d.fs.exists(d.path(name)):
        _rename(d, tmp, name)
        return
    aside = f".replaced-{name}-{uuid.uuid4().hex}"
    _rename(d, name, aside)
    _rename(d, tmp, name)
    _remove(d, aside)


def _rename(d: CheckpointDir, src: str, dst: str) -> None:
    if d.local:
        os.replace(d.path(src), d.path(dst))
        _fsync_dir(d.root)
    else:
        d.fs.mv(d.path(src), d.path(dst), recursive=True)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(d: CheckpointDir, name: str) -> None:
    try:
        d.fs.rm(d.path(name), recursive=True)
    except OSError as e:
        logger.warning("cannot delete old checkpoint data %s: %s", d.show(name), e)


def _prune(d: CheckpointDir, *, keep: int, protect: str) -> None:
    """Deletes all but the newest ``keep`` versions (never ``protect``) and stale temp dirs."""
    try:
        newest = [entry.name for entry, _ in islice(complete_versions(d), keep)]
    except CheckpointError as e:
        logger.warning("not pruning checkpoints in %s: %s", d.url, e)
        return
    if protect not in newest:
        logger.warning(
            "saved %s, but the %d newest versions in %s are of later epochs: it will not be loaded",
            protect, keep, d.url,
        )
    kept = {protect, *newest}
    for entry in versions(d):
        if entry.name not in kept:
            logger.info("deleting old checkpoint %s", d.show(entry.name))
            _remove(d, entry.name)
    for tmp in _stale_tmp_dirs(d):
        logger.info("deleting stale checkpoint temp dir %s", d.show(tmp))
        _remove(d, tmp)


# --- reading ---------------------------------------------------------------------------


def _stale_tmp_dirs(d: CheckpointDir) -> list[str]:
    now_ms = time.time() * 1000
    return [
        name
        for name in d.names()
        if (m := _TMP.match(name)) and now_ms - int(m.group(1)) > STALE_TMP_SECONDS * 1000
    ]
