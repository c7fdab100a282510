"""Reading an uploaded zip or tar with every byte it costs counted before it is held.

An upload is hostile until proven otherwise (issue 34, finding 1): Python's
`tarfile` reads a GNU long-name or PAX header whole, however large its declared
size, and counts it toward nothing, and `zipfile` builds an object per central
directory record before anyone can count them. So:

* tar: `tar_entries` is a tar reader of its own, streaming the decompressed bytes
  (gzip, bz2, xz or none) in 512-byte blocks. A long-name header may hold at most
  `MAX_PATH_BYTES`, a PAX header at most `MAX_PAX_BYTES`, at most
  `MAX_EXTENSIONS` of them in a row; every block read (headers, padding, data)
  counts against the unpacked-bytes limit and every member (folders too) against
  the entries limit, before its data is read.
* zip: `zip_entries` walks the central directory's records first (no objects, just
  their lengths), refusing more than the entries limit before `zipfile` sees them;
  then each entry's header bytes count beside its data.

Names are checked (`clean_path`: relative, no `..`, each component at most 255
bytes, the whole at most `MAX_PATH_BYTES`) before an entry's data is read. Every
refusal is an `ArchiveError` naming the entry; `over_limit` ones are what a bigger
limit would admit (413), the rest are malformed or forbidden (422).

What this does NOT do: store anything, or decide what a package must hold
(job_server.packages does).
"""

from __future__ import annotations

import bz2
import gzip
import io
import logging
import lzma
import stat
import struct
import zipfile
from collections.abc import Iterator
from typing import IO

from job_server.config import Limits

logger = logging.getLogger(__name__)

BLOCK = 512
CHUNK = 64 * 1024
MAX_COMPONENT_BYTES = 255   # NAME_MAX: a longer component cannot be stored (ENAMETOOLONG)
MAX_PATH_BYTES = 4096       # PATH_MAX: the longest path a package may hold
MAX_PAX_BYTES = 64 * 1024   # one PAX header's records (paths, times, a few xattrs)
MAX_EXTENSIONS = 4          # long-name, long-link and PAX headers before one member
SHOWN = 80                  # characters of a name an error message quotes


class ArchiveError(ValueError):
    """An archive refused; the message names the entry and the rule."""

    def __init__(self, message: str, *, over_limit: bool = False) -> None:
        super().__init__(message)
        self.over_limit = over_limit


def shown(name: str | bytes) -> str:
    """A short, printable prefix of an entry's name for an error message."""
    text = name.decode("utf-8", "backslashreplace") if isinstance(name, bytes) else name
    return repr(text[:SHOWN])


def clean_path(name: str) -> str:
    """The entry's path, relative and inside the package; raises `ArchiveError` otherwise."""
    if "\\" in name or "\x00" in name:
        raise ArchiveError(f"entry {shown(name)}: backslashes and NUL are not allowed in paths")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise ArchiveError(f"entry {shown(name)}: the name is not UTF-8") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise ArchiveError(f"entry {shown(name)}: the path is {len(encoded)} bytes long, "
                           f"at most {MAX_PATH_BYTES} are allowed")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise ArchiveError(f"entry {shown(name)} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"entry {shown(name)} climbs out of the package ('..')")
    for part in parts:
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise ArchiveError(f"entry {shown(name)}: the name {shown(part)} is longer than "
                               f"{MAX_COMPONENT_BYTES} bytes")
    return "/".join(parts)


class Budget:
    """Counts entries and bytes against the limits; refuses the first one over."""

    def __init__(self, limits: Limits) -> None:
        self.limits, self.entries, self.bytes = limits, 0, 0

    def entry(self, name: str | bytes) -> None:
        self.entries += 1
        if self.entries > self.limits.max_files:
            raise ArchiveError(f"more than {self.limits.max_files} entries (max_files; folders "
                               f"count too), at {shown(name)}", over_limit=True)

    def spend(self, count: int, *, name: str | bytes) -> None:
        self.bytes += count
        if self.bytes > self.limits.max_unpacked_bytes:
            raise ArchiveError(
                f"the package unpacks to more than {self.limits.max_unpacked_bytes} bytes "
                f"(max_unpacked_bytes; headers count too), at {shown(name)}: a bomb, or raise "
                "the limit", over_limit=True)

    def read(self, name: str, stream: IO[bytes], size: int | None = None) -> bytes:
        """`size` bytes of `stream` (None: all of it), counted a chunk at a time."""
        out = io.BytesIO()
        left = -1 if size is None else size
        while left:
            chunk = stream.read(CHUNK if left < 0 else min(CHUNK, left))
            if not chunk:
                if left > 0:
                    raise ArchiveError(f"entry {shown(name)} is cut short: the archive is truncated")
                break
            self.spend(len(chunk), name=name)
            out.write(chunk)
            left -= len(chunk) if left > 0 else 0
        return out.getvalue()


# ---- tar -------------------------------------------------------------------------------------
def tar_stream(data: bytes | bytearray) -> IO[bytes] | None:
    """The decompressed stream of a tar, tar.gz, tar.bz2 or tar.xz; None for anything else."""
    raw = io.BytesIO(data)
    head = bytes(data[:6])
    if head.startswith(b"\x1f\x8b"):
        stream: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb")
    elif head.startswith(b"BZh"):
        stream = bz2.BZ2File(raw)
    elif head.startswith(b"\xfd7zXZ\x00"):
        stream = lzma.LZMAFile(raw)
    else:
        stream = raw
    try:
        first = stream.read(BLOCK)
    except (OSError, EOFError, lzma.LZMAError):
        return None
    if len(first) < BLOCK or not _checksum_ok(first):
        return None
    return _Prepended(first, stream)


class _Prepended(io.RawIOBase):
    """`first` (already read to recognise the archive), then the rest of `stream`."""

    def __init__(self, first: bytes, stream: IO[bytes]) -> None:
        self.first, self.stream = first, stream

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self.first:
            head, self.first = (self.first, b"") if size < 0 or size >= len(self.first) else (
                self.first[:size], self.first[size:])
            return head
        return self.stream.read(size)


def _number(field: bytes) -> int:
    """A header's number: octal (NUL/space padded) or GNU base-256."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    if field[:1] == b"\xff":
        return -1  # a negative number: no size, time or checksum of a package is one
    text = field.split(b"\x00", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise ArchiveError(f"a tar header holds the number {shown(field)}, not octal") from None


def _checksum_ok(block: bytes) -> bool:
    try:
        stored = _number(block[148:156])
    except ArchiveError:
        return False
    unsigned = sum(block[:148]) + sum(block[156:]) + 8 * 32
    signed = sum(struct.unpack("148b", block[:148])) + sum(struct.unpack("356b", block[156:])) + 256
    return stored in (unsigned, signed)


def _text(field: bytes) -> str:
    return field.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def _pax_records(payload: bytes, *, where: str) -> dict[str, str]:
    """`LENGTH KEY=VALUE\\n` records of a PAX header (POSIX.1-2001)."""
    records: dict[str, str] = {}
    at = 0
    while at < len(payload) and payload[at:at + 1] != b"\x00":
        space = payload.find(b" ", at)
        try:
            length = int(payload[at:space]) if space > at else 0
        except ValueError:
            length = 0
        record = payload[space + 1:at + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise ArchiveError(f"a malformed PAX header {where}")
        key, value = record[:-1].split(b"=", 1)
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        at += length
    return records


def _pax_refused(key: str) -> bool:
    """PAX keys that change how the data is read: a reader ignoring them would read another
    archive than the one meant (GNU sparse files; sizes over 8 GiB, far over any limit)."""
    return key == "size" or key.startswith("GNU.sparse.")


_REGULAR = (b"0", b"\x00", b"7")
_LINKS = (b"1", b"2")
_SPECIAL = (b"3", b"4", b"6")


class _TarMember:
    """One member's header after its long-name and PAX headers are applied."""

    def __init__(self, block: bytes, *, long_name: str | None, long_link: str | None,
                 pax: dict[str, str]) -> None:
        name = _text(block[0:100])
        prefix = _text(block[345:500]) if block[257:262] == b"ustar" else ""
        self.kind = block[156:157]
        if self.kind == b"\x00" and name.endswith("/"):
            self.kind = b"5"  # V7 tar's folder: a plain entry whose name ends in '/'
        self.name = pax.get("path") or long_name or (f"{prefix}/{name}" if prefix else name)
        self.link = pax.get("linkpath") or long_link or _text(block[157:257])
        self.size = _number(block[124:136])
        if self.size < 0:
            raise ArchiveError(f"entry {shown(self.name)} declares a negative size")

    @property
    def regular(self) -> bool:
        return self.kind in _REGULAR

    @property
    def data_blocks(self) -> int:
        """Bytes of data after the header (padded to whole blocks); folders carry none."""
        return -(-self.size // BLOCK) * BLOCK if self.regular else 0


class _TarReader:
    """Headers and data of a decompressed tar stream, each counted before it is held."""

    def __init__(self, stream: IO[bytes], budget: Budget) -> None:
        self.stream, self.budget, self.last = stream, budget, ""

    @property
    def where(self) -> str:
        """Where in the archive the reader is, for an error message."""
        return f"after entry {shown(self.last)}" if self.last else "at the archive's start"

    def block(self) -> bytes | None:
        """The next header block; None at the end of the archive."""
        block = self.stream.read(BLOCK)
        if not block:
            return None  # no end-of-archive blocks: tar itself accepts that
        if len(block) < BLOCK:
            raise ArchiveError(f"the archive is truncated {self.where}")
        self.budget.spend(BLOCK, name=self.last)
        if block.count(0) == BLOCK:
            return None
        if not _checksum_ok(block):
            raise ArchiveError(f"a damaged tar header (bad checksum) {self.where}")
        return block

    def skip(self, count: int, *, name: str) -> None:
        while count:
            chunk = self.stream.read(min(CHUNK, count))
            if not chunk:
                raise ArchiveError(f"entry {shown(name)} is cut short: the archive is truncated")
            self.budget.spend(len(chunk), name=name)
            count -= len(chunk)

    def extension(self, block: bytes, *, cap: int, what: str) -> bytes:
        """The payload of a long-name or PAX header, refused unread when over `cap`."""
        size = _number(block[124:136])
        if size < 0 or size > cap:
            raise ArchiveError(f"a {what} header of {size} bytes {self.where}: at most {cap} "
                               "are allowed (a header bomb?)")
        payload = self.budget.read(self.last, self.stream, size)
        self.skip(-(-size // BLOCK) * BLOCK - size, name=self.last)
        return payload

    def members(self) -> Iterator[_TarMember]:
        """Each member, its extension headers applied; its data is next in the stream."""
        long_name = long_link = None
        pax: dict[str, str] = {}
        global_pax: dict[str, str] = {}
        extensions = 0
        while (block := self.block()) is not None:
            kind = block[156:157]
            if kind in (b"L", b"K", b"x", b"g"):
                extensions += 1
                if extensions > MAX_EXTENSIONS:
                    raise ArchiveError(f"more than {MAX_EXTENSIONS} extended headers in a row "
                                       f"{self.where}")
                if kind in (b"L", b"K"):
                    text = _text(self.extension(block, cap=MAX_PATH_BYTES + 1, what="GNU long-name"))
                    long_name, long_link = (text, long_link) if kind == b"L" else (long_name, text)
                else:
                    records = _pax_records(self.extension(block, cap=MAX_PAX_BYTES, what="PAX"),
                                           where=self.where)
                    for key in records:
                        if _pax_refused(key):
                            raise ArchiveError(f"a PAX header {self.where} sets "
                                               f"{shown(key)}: sparse files and sizes over 8 GiB "
                                               "are not taken")
                    (global_pax if kind == b"g" else pax).update(records)
                continue
            member = _TarMember(block, long_name=long_name, long_link=long_link,
                                pax={**global_pax, **pax})
            self.last = member.name
            self.budget.entry(member.name)
            yield member
            long_name = long_link = None
            pax, extensions = {}, 0
        if extensions:
            raise ArchiveError(f"the archive ends in an extended header {self.where}")


def tar_entries(stream: IO[bytes], budget: Budget) -> Iterator[tuple[str, bytes | None]]:
    """(path, bytes) of each file, (path, None) of each folder, of a decompressed tar."""
    reader = _TarReader(stream, budget)
    for member in reader.members():
        path = clean_path(member.name)
        if member.kind in _LINKS:
            raise ArchiveError(f"entry {shown(member.name)} is a link to {shown(member.link)}: "
                               "links are not allowed")
        if member.kind in _SPECIAL:
            raise ArchiveError(f"entry {shown(member.name)} is a device, fifo or other special file")
        if member.kind == b"5":
            yield path, None
            continue
        if not member.regular:
            raise ArchiveError(f"entry {shown(member.name)} has tar type {member.kind!r} (sparse, "
                               "volume or vendor-specific): a package holds plain files only")
        if not path:
            raise ArchiveError(f"entry {shown(member.name)} is a file without a name")
        content = budget.read(member.name, stream, member.size)
        reader.skip(member.data_blocks - member.size, name=member.name)
        yield path, content


# ---- zip -------------------------------------------------------------------------------------
_END = struct.Struct("<4s4H2LH")            # end of central directory record
_END64 = struct.Struct("<4sQ2H2L4Q")         # zip64 end of central directory record
_LOCATOR = struct.Struct("<4sLQL")           # zip64 end of central directory locator
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")   # a central directory file header
_LOCAL_FIXED = 30                            # a local file header before its name and extra


def _central_directory(data: bytes | bytearray) -> tuple[int, int]:
    """(start, size) of the central directory where `zipfile` will look for it."""
    end = data.rfind(b"PK\x05\x06", max(0, len(data) - _END.size - 65535))
    if end < 0 or end + _END.size > len(data):
        raise ArchiveError("no end of central directory record")
    size = _END.unpack_from(data, end)[5]
    locator = end - _LOCATOR.size
    if locator >= 0 and data[locator:locator + 4] == b"PK\x06\x07":
        record = locator - _END64.size
        if record < 0 or data[record:record + 4] != b"PK\x06\x06":
            raise ArchiveError("a damaged zip64 end of central directory record")
        size = _END64.unpack_from(data, record)[8]
        return record - size, size
    return end - size, size


def count_zip_entries(data: bytes | bytearray, budget: Budget) -> None:
    """Counts the central directory's records (and their names' bytes) before `zipfile`
    builds an object for each: a zip of a million empty entries stops at the limit."""
    start, size = _central_directory(data)
    at, stop = start, start + size
    while at < stop:
        if at < 0 or at + _CENTRAL.size > len(data) or data[at:at + 4] != b"PK\x01\x02":
            raise ArchiveError("a damaged central directory record")
        fields = _CENTRAL.unpack_from(data, at)
        name = bytes(data[at + _CENTRAL.size:at + _CENTRAL.size + fields[12]])
        budget.entry(name)
        record = _CENTRAL.size + fields[12] + fields[13] + fields[14]
        budget.spend(record + _LOCAL_FIXED + fields[12], name=name)  # its local header repeats the name
        at += record


def zip_entries(data: bytes | bytearray, budget: Budget) -> Iterator[tuple[str, bytes | None]]:
    """(path, bytes) of each file, (path, None) of each folder, of a zip."""
    count_zip_entries(data, budget)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            path = clean_path(info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise ArchiveError(f"entry {shown(info.filename)} is a symbolic link: links are "
                                   "not allowed (they may point out of the package)")
            if info.is_dir() or not path:
                yield path, None
                continue
            if stat.S_IFMT(mode) and not stat.S_ISREG(mode):  # no type bits: a plain file
                raise ArchiveError(f"entry {shown(info.filename)} is not a regular file")
            with archive.open(info) as stream:
                yield path, budget.read(path, stream)
