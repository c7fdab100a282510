"""Trainer packages: unpacked safely, stored by content hash through fsspec.

`unpack` takes a zip or tar.gz upload and returns its files in memory, refusing —
with an error naming the entry — absolute paths, `..`, links, device files and
fifos, more than `max_files` files, and more than `max_unpacked_bytes` in all
(counted while decompressing, so a zip bomb stops at the limit, whatever its
headers claim). One top folder holding everything is stripped; `requirements.txt`
must be at the package's root. Nothing is written before every check passed.

`PackageStore` keeps a package under `packages/DIGEST/` of any fsspec URL (a PVC
path, `s3://...`, `memory://` in tests); DIGEST hashes the files' paths and bytes,
so the same package uploaded twice — re-zipped, other timestamps — is stored once.
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
import posixpath
import stat
import tarfile
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

import fsspec

from job_server.config import Limits

logger = logging.getLogger(__name__)

REQUIREMENTS = "requirements.txt"
CHUNK = 64 * 1024
MANIFEST = "manifest.json"


class PackageError(ValueError):
    """An upload that is refused; the message names the entry and the rule."""


def _clean_path(name: str) -> str:
    """The entry's path, relative and inside the package; raises `PackageError` otherwise."""
    shown = name[:80]
    if "\\" in name or "\x00" in name:
        raise PackageError(f"entry {shown!r}: backslashes and NUL are not allowed in paths")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise PackageError(f"entry {shown!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PackageError(f"entry {shown!r} climbs out of the package ('..')")
    return "/".join(parts)


class _Budget:
    """Counts files and unpacked bytes against the limits."""

    def __init__(self, limits: Limits) -> None:
        self.limits, self.files, self.bytes = limits, 0, 0

    def file(self, name: str) -> None:
        self.files += 1
        if self.files > self.limits.max_files:
            raise PackageError(f"more than {self.limits.max_files} files (max_files); at {name[:80]!r}")

    def read(self, name: str, stream: IO[bytes]) -> bytes:
        out = io.BytesIO()
        while chunk := stream.read(CHUNK):
            self.bytes += len(chunk)
            if self.bytes > self.limits.max_unpacked_bytes:
                raise PackageError(
                    f"the package unpacks to more than {self.limits.max_unpacked_bytes} bytes "
                    f"(max_unpacked_bytes), at {name[:80]!r}: a zip bomb, or raise the limit")
            out.write(chunk)
        return out.getvalue()


def _zip_entries(data: bytes, budget: _Budget) -> Iterator[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            path = _clean_path(info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise PackageError(f"entry {info.filename[:80]!r} is a symbolic link: links are "
                                   "not allowed (they may point out of the package)")
            if info.is_dir() or not path:
                continue
            if stat.S_IFMT(mode) and not stat.S_ISREG(mode):  # no type bits: a plain file
                raise PackageError(f"entry {info.filename[:80]!r} is not a regular file")
            budget.file(path)
            with archive.open(info) as stream:
                yield path, budget.read(path, stream)


def _tar_entries(data: bytes, budget: _Budget) -> Iterator[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
        for member in archive:
            path = _clean_path(member.name)
            if member.issym() or member.islnk():
                raise PackageError(f"entry {member.name[:80]!r} is a link to "
                                   f"{member.linkname[:80]!r}: links are not allowed")
            if member.isdir() or not path:
                continue
            if not member.isfile():
                raise PackageError(f"entry {member.name[:80]!r} is a device, fifo or other "
                                   "special file")
            budget.file(path)
            stream = archive.extractfile(member)
            if stream is None:
                raise PackageError(f"entry {member.name[:80]!r} has no data")
            yield path, budget.read(path, stream)


def unpack(data: bytes, *, filename: str, limits: Limits) -> dict[str, bytes]:
    """The files of a zip or tar.gz package (see the module doc for what is refused)."""
    budget = _Budget(limits)
    if zipfile.is_zipfile(io.BytesIO(data)):
        entries = _zip_entries(data, budget)
    else:
        try:
            tarfile.open(fileobj=io.BytesIO(data), mode="r:*").close()
        except (tarfile.TarError, EOFError, OSError):
            raise PackageError(f"{filename[:80]!r} is neither a zip nor a tar.gz archive") from None
        entries = _tar_entries(data, budget)
    files: dict[str, bytes] = {}
    try:
        for path, content in entries:
            if path in files:
                raise PackageError(f"entry {path[:80]!r} appears twice")
            files[path] = content
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, RuntimeError) as error:
        raise PackageError(f"{filename[:80]!r} is a broken archive: {error}") from None
    if not files:
        raise PackageError(f"{filename[:80]!r} holds no files")
    tops = {p.split("/", 1)[0] for p in files}
    if len(tops) == 1 and all("/" in p for p in files):  # one folder zipped: its contents
        top = tops.pop() + "/"
        files = {p[len(top):]: c for p, c in files.items()}
    if REQUIREMENTS not in files:
        raise PackageError(f"{filename[:80]!r} has no {REQUIREMENTS} at its root "
                           "(an empty one will do)")
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
        base = self._dir(key)
        for path, content in files.items():
            target = posixpath.join(base, "files", path)
            self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
            self.fs.pipe_file(target, content)
        # the manifest last: a package is there once its manifest is
        self.fs.pipe_file(posixpath.join(base, MANIFEST),
                          json.dumps({"files": sorted(files), "size": size}).encode())
        return StoredPackage(key, tuple(sorted(files)), size, reused=False)

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
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        if protocol in ("file", "local"):
            return posixpath.relpath(path, self.root)  # on the claim mounted at the store's root
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
