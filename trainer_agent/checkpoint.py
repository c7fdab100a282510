"""Checkpoints of a trainer's state, with the EDL ``TrainStatus`` contract.

``save_checkpoint(path, state, TrainStatus(epoch))`` writes one *version* directory
``<path>/checkpoint-<epoch:08d>`` holding ``state.pkl`` (the state mapping, pickled
with protocol 5) and ``meta.json`` (epoch, time, format version, size of the state),
written in that order into a hidden ``.tmp-<ms>-<hex>`` directory that is renamed
into place only when complete. ``load_checkpoint`` returns the newest complete
version; ``latest_train_status`` reads only its ``meta.json`` so launchers can pass
``--start-epoch = TrainStatus.next()`` cheaply. Reading versions is shared with the
local backend and the master (``paddlecloud.checkpoints``); writing is here.

EDL's calls work as its users write them (seed 000): ``save_checkpoint(exe,
train_status=..., path=..., fs=...)`` and ``load_checkpoint(exe, path, fs=...,
trainer_id=...)``, where ``exe`` is what is saved and loaded into (a mapping, or a
Paddle layer or optimizer through ``state_dict``) and ``fs`` any fsspec filesystem;
``hdfs://`` needs the ``hdfs`` extra (pyarrow).

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
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

import fsspec

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


def save_checkpoint(*args: Any, path: str | None = None, state: Any = None,
                    train_status: TrainStatus | None = None, fs: Any = None, keep: int = 3) -> str:
    """Writes a new version under ``path``, keeps the newest ``keep``; returns the version's path.

    Two forms: ``save_checkpoint(path, state, train_status)``, and EDL's
    ``save_checkpoint(what, train_status=..., path=..., fs=...)`` where ``what`` (in
    place of EDL's executor) is the state: a mapping, or an object with ``state_dict()``
    (a Paddle layer or optimizer; tensors are saved as numpy arrays). ``fs`` is any
    fsspec filesystem ``path`` lives on (default: the one its URL names).

    Raises CheckpointError naming the directory when writing fails (the previous
    versions are untouched), TypeError/ValueError for bad arguments, and whatever
    pickle raises for an unpicklable state.
    """
    path, state, train_status = _save_args(args, path=path, state=state, train_status=train_status)
    state = _state_of(state)
    _check_save_args(state, train_status, keep)
    d = _checkpoint_dir(path, fs)
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


def load_checkpoint(*args: Any, path: str | None = None, fs: Any = None,
                    trainer_id: int | None = None) -> Any:
    """The newest complete version under ``path``, or None if there is none.

    ``load_checkpoint(path)`` returns its ``(state, TrainStatus)``. EDL's form
    ``load_checkpoint(what, path, fs=..., trainer_id=...)`` loads the state into
    ``what`` (a mutable mapping is updated, an object with ``set_state_dict`` is given
    it) and returns the TrainStatus alone; ``trainer_id`` names the loading trainer in
    the log. ``fs`` is any fsspec filesystem ``path`` lives on.

    Raises CheckpointError naming the file when the newest complete version does not
    unpickle (e.g. a class it refers to is gone): it does not silently fall back.
    """
    target, path = _load_args(args, path=path)
    if trainer_id is not None and (isinstance(trainer_id, bool) or not isinstance(trainer_id, int)
                                   or trainer_id < 0):
        raise ValueError(f"invalid trainer_id {trainer_id!r}: need an int >= 0")
    d = _checkpoint_dir(path, fs)
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
    status = _status_of(meta)
    if target is _NO_TARGET:
        return state, status
    _load_into(target, state)
    logger.info("%sloaded checkpoint %s (epoch %d)",
                "" if trainer_id is None else f"trainer {trainer_id} ", d.show(entry.name), status.epoch)
    return status


_NO_TARGET = object()


def _save_args(args: tuple[Any, ...], *, path: str | None, state: Any,
               train_status: TrainStatus | None) -> tuple[str, Any, TrainStatus]:
    """(path, state, train_status) of either form (see `save_checkpoint`)."""
    if args and isinstance(args[0], str | os.PathLike):  # save_checkpoint(path, state, status)
        names = ("path", "state", "train_status")
    else:  # EDL: save_checkpoint(what, path, train_status) and its keywords
        names = ("state", "path", "train_status")
    given = {"path": path, "state": state, "train_status": train_status}
    if len(args) > len(names):
        raise TypeError(f"save_checkpoint takes at most 3 positional arguments ({len(args)} given)")
    for name, value in zip(names, args, strict=False):
        if given[name] is not None:
            raise TypeError(f"save_checkpoint got two values for {name!r}")
        given[name] = value
    if given["path"] is None:
        raise TypeError("save_checkpoint needs path= (the checkpoint directory)")
    if given["train_status"] is None:
        raise TypeError("save_checkpoint needs train_status= (a TrainStatus)")
    return os.fspath(given["path"]), given["state"], given["train_status"]


def _load_args(args: tuple[Any, ...], *, path: str | None) -> tuple[Any, str]:
    """(target, path) of either form (see `load_checkpoint`); `_NO_TARGET` for the plain one."""
    if len(args) > 2:
        raise TypeError(f"load_checkpoint takes at most 2 positional arguments ({len(args)} given)")
    if len(args) == 1 and isinstance(args[0], str | os.PathLike) and path is None:
        return _NO_TARGET, os.fspath(args[0])
    target, rest = (args[0], args[1:]) if args else (_NO_TARGET, ())
    if rest and path is not None:
        raise TypeError("load_checkpoint got two values for 'path'")
    path = rest[0] if rest else path
    if path is None:
        raise TypeError("load_checkpoint needs path= (the checkpoint directory)")
    return target, os.fspath(path)


def _state_of(what: Any) -> Any:
    """The mapping to save: `what` itself, or its ``state_dict()`` with tensors as numpy."""
    if isinstance(what, Mapping) or not callable(getattr(what, "state_dict", None)):
        return what  # _check_save_args names a value that is neither
    return {key: value.numpy() if callable(getattr(value, "numpy", None)) else value
            for key, value in what.state_dict().items()}


def _load_into(target: Any, state: dict[str, Any]) -> None:
    if isinstance(target, MutableMapping):
        target.clear()
        target.update(state)
    elif callable(getattr(target, "set_state_dict", None)):
        target.set_state_dict(state)
    else:
        raise TypeError(f"cannot load a checkpoint into a {type(target).__name__}: pass a mutable "
                        "mapping or an object with set_state_dict() (a Paddle layer or optimizer)")


def _checkpoint_dir(path: str, fs: Any) -> CheckpointDir:
    """The directory `path`, on `fs` when one is given (any fsspec filesystem)."""
    if fs is None:
        return CheckpointDir.of(path)
    if not isinstance(fs, fsspec.AbstractFileSystem):
        raise TypeError(f"fs must be an fsspec filesystem (e.g. fsspec.filesystem('hdfs', "
                        f"host=...)), not a {type(fs).__name__}")
    return CheckpointDir(fs, fs._strip_protocol(path).rstrip("/"), path.rstrip("/"))


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
        raise TypeError(f"checkpoint state must be a Mapping or have state_dict(), "
                        f"not {type(state).__name__}")
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
