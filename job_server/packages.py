"""Trainer packages: unpacked safely, stored by content hash through fsspec.

`unpack` takes a zip or tar (.tar, .tar.gz, .tar.bz2, .tar.xz) upload and returns its
files in memory, refusing — with an error naming the entry — absolute paths, `..`,
names over 255 bytes a component, links, device files and fifos, a path that is both
a file and a folder (`a` and `a/b`), more than `max_files` entries (folders
count), and more than `max_unpacked_bytes` in all (headers count,
and it is counted while decompressing, so a bomb stops at the limit whatever its
headers claim; job_server.archives reads it). A refusal over a limit is a 413,
any other a 422 (`PackageError.status`). One top folder holding everything is
stripped; `requirements.txt` must be at the package's root (seed 001's `requirments.txt`
is read as it, with a warning: paddlecloud.trainer_package); no top-level name may
shadow one of paddlecloud's modules (paddlecloud.package_names). Nothing is written
before every check passed.

`PackageStore` keeps a package under `packages/DIGEST/` of any fsspec URL (a PVC
path, `s3://...`, `memory://` in tests); DIGEST hashes the files' paths and bytes,
so the same package uploaded twice — re-zipped, other timestamps — is stored once.
A package is written under `.incoming/` and moved into place whole (a rename on a
local store), so a write that breaks leaves no part of a package behind.
Beside them it keeps the image builds' contexts (`contexts/TAG.tar.gz`) and a record
of each image built (`images/TAG.json`, TAG hashing package and base image), which
outlives the build Job, so a pair is built once.

What this does NOT guarantee: that the package's code runs, nor that its
requirements install (the image build finds out); that a recorded image is still in
the registry (delete `images/TAG.json` to build it again).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec

from job_server import archives
from job_server.config import Limits
from paddlecloud.jobspec import JobSpecError
from paddlecloud.package_names import check_package_names
from paddlecloud.trainer_package import REQUIREMENTS, with_requirements

logger = logging.getLogger(__name__)

CHUNK = archives.CHUNK
MANIFEST = "manifest.json"
TEMPORARY = ".incoming"  # packages being written, renamed into packages/ once whole


class PackageError(ValueError):
    """An upload that is refused; the message names the entry and the rule. `status`: 413
    for what a bigger limit would admit, 422 for what no limit would."""

    def __init__(self, message: str, *, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def _entries(data: bytes | bytearray, *, filename: str,
             budget: archives.Budget) -> Iterator[tuple[str, bytes | None]]:
    if zipfile.is_zipfile(io.BytesIO(data)):
        return archives.zip_entries(data, budget)
    stream = archives.tar_stream(data)
    if stream is None:
        raise PackageError(f"{archives.shown(filename)} is neither a zip nor a tar "
                           "(.tar, .tar.gz, .tar.bz2, .tar.xz) archive")
    return archives.tar_entries(stream, budget)


def _collect(entries: Iterator[tuple[str, bytes | None]]) -> dict[str, bytes]:
    """The files of `entries`; a path given twice, or both as a file and as a folder of
    other entries (`a` and `a/b`), is refused naming it: it could not be stored."""
    files: dict[str, bytes] = {}
    folders: set[str] = set()
    for path, content in entries:
        parents = ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)]
        clash = next((p for p in parents if p in files), None)
        if clash is not None:
            raise PackageError(f"entry {archives.shown(path)} is inside {archives.shown(clash)}, "
                               "which the package also holds as a file")
        folders.update(parents)
        if content is None:
            if path in files:
                raise PackageError(f"entry {archives.shown(path)} is both a file and a folder")
            folders.add(path)
            continue
        if path in files:
            raise PackageError(f"entry {archives.shown(path)} appears twice")
        if path in folders:
            raise PackageError(f"entry {archives.shown(path)} is both a file and a folder")
        files[path] = content
    return files


def unpack(data: bytes | bytearray, *, filename: str, limits: Limits,
           warn: Callable[[str], None] = logger.warning) -> dict[str, bytes]:
    """The files of a zip or tar package (see the module doc for what is refused); `warn`
    hears what is taken other than as written (seed 001's requirments.txt)."""
    budget = archives.Budget(limits)
    try:
        files = _collect(_entries(data, filename=filename, budget=budget))
    except archives.ArchiveError as error:
        raise PackageError(str(error), status=413 if error.over_limit else 422) from None
    except PackageError:
        raise
    except Exception as error:  # noqa: BLE001 - any parser failure on untrusted bytes is a 422
        raise PackageError(f"{archives.shown(filename)} is a broken archive "
                           f"({type(error).__name__}: {str(error)[:200]})") from None
    if not files:
        raise PackageError(f"{archives.shown(filename)} holds no files")
    tops = {p.split("/", 1)[0] for p in files}
    if len(tops) == 1 and all("/" in p for p in files):  # one folder zipped: its contents
        top = tops.pop() + "/"
        files = {p[len(top):]: c for p, c in files.items()}
    try:
        files = with_requirements(files, where=archives.shown(filename), warn=warn)
    except JobSpecError as error:
        raise PackageError(str(error)) from None
    if REQUIREMENTS not in files:
        raise PackageError(f"{archives.shown(filename)} has no {REQUIREMENTS} at its root "
                           "(an empty one will do)")
    try:
        check_package_names(files)
    except JobSpecError as error:
        raise PackageError(str(error)) from None
    return files


def digest(files: Mapping[str, bytes]) -> str:
    """The content hash of a package: its paths and bytes, in path order."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return h.hexdigest()


@dataclass(frozen=True)
class StoredPackage:
    digest: str
    files: tuple[str, ...]
    size: int
    reused: bool


class PackageStore:
    """Packages by digest under an fsspec URL; a package is stored once."""

    def __init__(self, url: str) -> None:
        self.fs, root = fsspec.core.url_to_fs(url)
        self.root = root.rstrip("/")
        self.url = url

    def _dir(self, key: str) -> str:
        return posixpath.join(self.root, "packages", key)

    def exists(self, key: str) -> bool:
        return self.fs.exists(posixpath.join(self._dir(key), MANIFEST))

    def put(self, files: Mapping[str, bytes]) -> StoredPackage:
        key = digest(files)
        size = sum(len(c) for c in files.values())
        if self.exists(key):
            return StoredPackage(key, tuple(sorted(files)), size, reused=True)
        incoming = posixpath.join(self.root, TEMPORARY, f"{key}-{uuid.uuid4().hex}")
        try:
            for path, content in files.items():
                target = posixpath.join(incoming, "files", path)
                self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
                self.fs.pipe_file(target, content)
            # the manifest last: a package is there once its manifest is
            self.fs.pipe_file(posixpath.join(incoming, MANIFEST),
                              json.dumps({"files": sorted(files), "size": size}).encode())
            self._publish(incoming, key)
        finally:
            if self.fs.exists(incoming):
                self.fs.rm(incoming, recursive=True)
        return StoredPackage(key, tuple(sorted(files)), size, reused=False)

    def _publish(self, incoming: str, key: str) -> None:
        """Moves a whole package into place: one rename on a local store (all or nothing);
        on object stores, where a move copies, the manifest still lands after the files."""
        final = self._dir(key)
        if self.exists(key):  # stored meanwhile by another upload of the same files
            return
        if self.fs.exists(final):  # left by a write that broke before its manifest
            self.fs.rm(final, recursive=True)
        self.fs.makedirs(posixpath.dirname(final), exist_ok=True)
        if self._local:
            try:
                os.rename(incoming, final)
            except OSError:
                if not self.exists(key):  # not a twin upload that won the race
                    raise
            return
        for path in sorted(self.fs.find(incoming), key=lambda p: p.endswith(MANIFEST)):
            self.fs.mv(path, posixpath.join(final, posixpath.relpath(path, incoming)))

    @property
    def _local(self) -> bool:
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return protocol in ("file", "local")

    def get(self, key: str) -> dict[str, bytes]:
        """The files of a stored package; KeyError when there is none."""
        if not (len(key) == 64 and all(c in "0123456789abcdef" for c in key)) or not self.exists(key):
            raise KeyError(key)
        base = self._dir(key)
        manifest: dict[str, Any] = json.loads(self.fs.cat_file(posixpath.join(base, MANIFEST)))
        return {p: self.fs.cat_file(posixpath.join(base, "files", p)) for p in manifest["files"]}

    def put_context(self, tag: str, archive: bytes) -> str:
        """Stores a build context; returns its location for the builder (path or URL)."""
        path = posixpath.join(self.root, "contexts", f"{tag}.tar.gz")
        if not self.fs.exists(path):
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self.fs.pipe_file(path, archive)
        if self._local:
            return posixpath.relpath(path, self.root)  # on the claim mounted at the store's root
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return f"{protocol}://{path}"

    def _image_record(self, tag: str) -> str:
        return posixpath.join(self.root, "images", f"{tag}.json")

    def record_image(self, tag: str, image: str) -> None:
        """Records that image `tag` was built and pushed as `image`."""
        path = self._image_record(tag)
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.fs.pipe_file(path, json.dumps({"image": image}).encode())

    def recorded_image(self, tag: str) -> str | None:
        """The image recorded for `tag`; None when it was never built."""
        path = self._image_record(tag)
        if not self.fs.exists(path):
            return None
        return str(json.loads(self.fs.cat_file(path))["image"])
