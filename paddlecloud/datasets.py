"""Expands a dataset spec's paths and globs into the file list the master freezes in etcd.

Shared by the master (at a job's first start, in a thread: fsspec calls block) and
the CLIs (to refuse a glob that matches nothing before anything starts). Every later
start of the master and every standby reads the frozen list back, never a fresh
glob, so the tasks of a job never change under it. It never opens a file: only
names and sizes. What this does NOT guarantee: that the files are still there, or
the same size, when the trainers read them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import fsspec
from fsspec.core import split_protocol
from fsspec.registry import known_implementations

from paddlecloud.untrusted import loggable

logger = logging.getLogger(__name__)

GLOB_CHARS = "*?["
# The formats the trainers' readers take: one record per line in each of LINE_FORMATS, or a
# whole file per record (`file`).
LINE_FORMATS = ("lines", "csv", "tsv", "jsonl", "text")
FORMATS = (*LINE_FORMATS, "file")


@dataclass(frozen=True)
class FileEntry:
    """One file of a dataset: its path (URLs keep their protocol) and its size in bytes."""

    path: str
    size: int


class SpecError(ValueError):
    """A dataset spec or a setting is invalid; the message names the bad value."""


def _filesystem(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    protocol, _ = split_protocol(path)
    try:
        fs, stripped = fsspec.core.url_to_fs(path)
    except ImportError as error:
        hint = known_implementations.get(protocol or "", {}).get("err") or str(error)
        raise SpecError(f"cannot read {path!r}: the {protocol}:// driver is missing ({hint})") from None
    except (ValueError, OSError) as error:  # OSError: a driver that cannot start (hdfs:// without Hadoop)
        raise SpecError(f"cannot read {path!r}: {loggable(str(error), limit=300)}") from None
    return fs, stripped


def _unstrip(fs: fsspec.AbstractFileSystem, original: str, name: str) -> str:
    """fsspec returns paths without the protocol; put it back for non-local ones."""
    protocol, _ = split_protocol(original)
    return fs.unstrip_protocol(name) if protocol and protocol != "file" else name


def list_files(paths: tuple[str, ...] | list[str]) -> list[FileEntry]:
    """Every file the paths name, in a stable order, with sizes. Errors name the bad path."""
    files: list[FileEntry] = []
    seen: set[str] = set()
    for path in paths:
        fs, stripped = _filesystem(path)
        try:
            if any(c in stripped for c in GLOB_CHARS):
                found = fs.glob(stripped, detail=True)
                entries = sorted((n, d) for n, d in found.items() if d.get("type") != "directory")
                if not entries:
                    raise SpecError(f"input glob {path!r} matches no file")
            elif fs.isdir(stripped):
                found = fs.find(stripped, detail=True)
                entries = sorted(found.items())
                if not entries:
                    raise SpecError(f"input directory {path!r} holds no file")
            elif fs.exists(stripped):
                entries = [(stripped, fs.info(stripped))]
            else:
                raise SpecError(f"input path {path!r} does not exist")
        except OSError as error:
            raise SpecError(f"cannot list {path!r}: {error}") from None
        for name, detail in entries:
            full = _unstrip(fs, path, name)
            if full not in seen:
                seen.add(full)
                files.append(FileEntry(full, int(detail.get("size") or 0)))
    return files
