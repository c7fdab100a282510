"""Where checkpoints live and how their versions are read: the read side every process shares.

A job's checkpoints are in `<output>/checkpoints` (`CHECKPOINTS_DIR`): the trainer
library writes them (`trainer_agent.checkpoint`), the local backend and the master
read the newest one's epoch to resume after it (`resume_epoch`), or, for a checkpoint
saved inside an epoch, that epoch with the tasks it consumed (`resume_point`). A version is a
directory `checkpoint-<epoch:08d>` (or `.replaced-checkpoint-<epoch>-<hex>` set aside
while an epoch is saved again) holding `state.pkl` and `meta.json`; a version is
complete when `meta.json` is valid and `state.pkl` has the size it records.

This module never unpickles a state (that runs code: `trainer_agent` does it for the
user who wrote it) and never writes. What it does NOT guarantee: that a version
found complete here is still there when it is loaded (one saver per directory,
which prunes old versions, is assumed).

`CheckpointEvery` (how often a collective job checkpoints inside an epoch) lives here
because the local CLI checks `--checkpoint-every` and the trainer library acts on it.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from paddlecloud.units import parse_duration

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
FORMAT_VERSION = 1
STATE_FILE = "state.pkl"
META_FILE = "meta.json"
TASKS_DONE = "tasks_done"  # in meta.json of a checkpoint saved inside its epoch: the tasks consumed

_PRIMARY = re.compile(r"^checkpoint-(\d{8,})$")
_REPLACED = re.compile(r"^\.replaced-checkpoint-(\d{8,})-[0-9a-f]+$")


class CheckpointError(Exception):
    """A checkpoint cannot be written or read; the message names the directory."""


# The extra that installs what fsspec needs for a protocol (pyproject.toml's extras).
EXTRAS = {"hdfs": "hdfs"}


def missing_filesystem(url: str, error: ImportError) -> str:
    """Why `url`'s filesystem cannot load, naming the extra that installs it where one does."""
    protocol = url.split("://", 1)[0] if "://" in url else ""
    extra = EXTRAS.get(protocol)
    if extra is None:
        return str(error)
    return f"{protocol}:// needs pyarrow: pip install 'paddlecloud[{extra}]' ({error})"


def checkpoints_dir(output: str) -> str:
    """The checkpoint directory of a job's output (a local path or an fsspec URL)."""
    return f"{output.rstrip('/')}/{CHECKPOINTS_DIR}"


@dataclass(frozen=True)
class CheckpointDir:
    """A checkpoint directory: its file system, its path there, and the path the user gave."""

    fs: fsspec.AbstractFileSystem
    root: str
    url: str

    @classmethod
    def of(cls, path: str) -> CheckpointDir:
        try:
            fs, root = fsspec.core.url_to_fs(path)
        except ImportError as error:
            raise ImportError(f"{path!r}: {missing_filesystem(path, error)}") from error
        return cls(fs, root.rstrip("/"), path.rstrip("/"))

    @property
    def local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def path(self, *names: str) -> str:
        """The file system path of ``names`` inside the directory."""
        return "/".join([self.root, *names])

    def show(self, *names: str) -> str:
        """``names`` inside the directory as the user spells it (for messages)."""
        return "/".join([self.url, *names])

    def names(self) -> list[str]:
        """The names directly inside the directory; none when it does not exist."""
        try:
            listing = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return [posixpath.basename(p.rstrip("/")) for p in listing]


@dataclass(frozen=True)
class Version:
    """A version directory: a primary ``checkpoint-N`` or a ``.replaced-`` one set aside."""

    name: str
    epoch: int
    primary: bool


def versions(d: CheckpointDir) -> list[Version]:
    """Every version directory, best first: higher epoch first, a primary before its aside."""
    found = []
    for name in d.names():
        if m := _PRIMARY.match(name):
            found.append(Version(name, int(m.group(1)), primary=True))
        elif m := _REPLACED.match(name):
            found.append(Version(name, int(m.group(1)), primary=False))
    return sorted(found, key=lambda v: (-v.epoch, not v.primary, v.name))


def complete_versions(d: CheckpointDir) -> Iterator[tuple[Version, dict[str, Any]]]:
    """The complete version of each epoch (its primary, else an aside) and its meta, newest first.

    Raises CheckpointError naming the file for a format version this code cannot read.
    """
    done: set[int] = set()
    for version in versions(d):
        if version.epoch in done:
            continue
        meta = _complete_meta(d, version)
        if meta is not None:
            done.add(version.epoch)
            yield version, meta


def resume_epoch(path: str) -> int:
    """The epoch a job resumes at (``TrainStatus.next()``): after the newest checkpoint's
    epoch, or that epoch itself when the checkpoint was saved inside it; else 0."""
    return resume_point(path)[0]


def has_checkpoint(path: str) -> bool:
    """Whether `path` holds a complete checkpoint (a job started on it resumes there)."""
    return next(complete_versions(CheckpointDir.of(path)), None) is not None


def resume_point(path: str) -> tuple[int, tuple[int, ...]]:
    """(epoch, tasks of it already consumed) where a group restart resumes: a checkpoint saved
    inside an epoch (its meta has `tasks_done`) resumes that epoch with those tasks done; one
    saved at an epoch's end resumes the next epoch from its start; none is (0, ())."""
    found = next(complete_versions(CheckpointDir.of(path)), None)
    if found is None:
        return 0, ()
    meta = found[1]
    if meta.get(TASKS_DONE) is None:
        return int(meta["epoch"]) + 1, ()
    return int(meta["epoch"]), tuple(sorted(int(t) for t in meta[TASKS_DONE]))


def _complete_meta(d: CheckpointDir, version: Version) -> dict[str, Any] | None:
    """The version's meta if it is complete (meta.json valid, state.pkl of its size)."""
    try:
        with d.fs.open(d.path(version.name, META_FILE), "rb") as f:
            meta = json.loads(f.read())
        state_bytes = int(d.fs.size(d.path(version.name, STATE_FILE)))
    except (OSError, ValueError) as e:
        logger.warning("skipping incomplete checkpoint %s: %s", d.show(version.name), e)
        return None
    format_version = meta.get("format_version") if isinstance(meta, dict) else None
    if format_version != FORMAT_VERSION:
        raise CheckpointError(
            f"{d.show(version.name, META_FILE)}: unsupported checkpoint format version "
            f"{format_version!r} (this paddlecloud reads version {FORMAT_VERSION})"
        )
    if meta.get("epoch") != version.epoch or meta.get("state_bytes") != state_bytes:
        logger.warning(
            "skipping torn checkpoint %s: meta.json says epoch %r, %r bytes; found %d, %d",
            d.show(version.name), meta.get("epoch"), meta.get("state_bytes"),
            version.epoch, state_bytes,
        )
        return None
    return meta


#: How often a trainer checkpoints inside an epoch (``CheckpointEvery.parse``'s syntax).
CHECKPOINT_EVERY_ENV = "PADDLECLOUD_CHECKPOINT_EVERY"


@dataclass(frozen=True)
class CheckpointEvery:
    """When a collective job checkpoints inside an epoch: every ``tasks`` tasks of the job
    (each trainer takes its share, ``ceil(tasks / trainers)``), or every ``seconds``.

    ``parse("20")`` is every 20 tasks, ``parse("30s")`` / ``parse("2m")`` a duration.
    """

    tasks: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.tasks is None) == (self.seconds is None):
            raise ValueError("CheckpointEvery needs exactly one of tasks and seconds")
        if self.tasks is not None and self.tasks < 1:
            raise ValueError(f"checkpoint every {self.tasks} tasks: need at least 1")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"checkpoint every {self.seconds}s: need a positive duration")

    @classmethod
    def parse(cls, text: str) -> CheckpointEvery:
        """``N`` (tasks) or a duration (``30s``, ``2m``); a clear ValueError otherwise."""
        raw = text.strip()
        if raw.isdigit():
            return cls(tasks=int(raw))
        try:
            return cls(seconds=parse_duration(raw))
        except ValueError:
            raise ValueError(f"checkpoint every {text[:40]!r}: need a number of tasks (20) "
                             "or a duration (30s, 2m)") from None

    @classmethod
    def from_env(cls) -> CheckpointEvery | None:
        """``$PADDLECLOUD_CHECKPOINT_EVERY`` parsed; None when unset or empty."""
        raw = os.environ.get(CHECKPOINT_EVERY_ENV, "").strip()
        return cls.parse(raw) if raw else None

    def due(self, *, tasks: int, elapsed: float, trainers: int) -> bool:
        """True once a trainer that read ``tasks`` tasks in ``elapsed`` seconds should stop."""
        if self.tasks is not None:
            return tasks >= -(-self.tasks // max(trainers, 1))
        return elapsed >= (self.seconds or 0.0)

    def __str__(self) -> str:
        return str(self.tasks) if self.tasks is not None else f"{self.seconds:g}s"
