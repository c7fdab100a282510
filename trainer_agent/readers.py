"""Shard readers: turn a chunk (a byte range of a file) into the records it owns.

The master cuts every input file into byte ranges without ever reading the data
(docs/design.md section 4); this module is the trainer's side of that contract. A reader
yields exactly the records whose first byte lies in ``[begin, end)`` (the Hadoop
input-split rule), so cutting a file at *any* offsets gives every record to exactly
one chunk. Compressed files and the ``file`` format cannot be split: their chunk is
the whole file, and ``splittable(fmt, path)`` is what the master uses to decide.

Formats are looked up in an open registry (``register_reader``); built in are
``lines`` (aliases ``csv``, ``tsv``, ``jsonl``, ``text``: newline-delimited UTF-8,
one ``str`` per line without its ``\\n`` or ``\\r\\n``) and ``file`` (the file's
stored bytes as one ``bytes`` record, not decompressed).

``read_chunk_at`` also says, after each record, the file offset where the next record
starts, for readers that know it (``lines``): a trainer asked to split its task for an
idle one (work stealing, docs/design.md section 5a) stops there, at a record boundary.

Every failure to read (missing file, I/O error, corrupt compressed stream, invalid
UTF-8, missing fsspec driver) raises ``DataError`` with a one-line message naming the
path and, where known, the byte offset; the task client reports it as ``TaskFailed``.

Not guaranteed: records are not parsed (a CSV line is one string; quoted newlines in
CSV fields are *not* supported, they split the record); a UTF-8 byte-order mark is
kept in the first record; a lone ``\\r`` is not a line terminator; a file that
changes after the master listed it gives undefined records (the master freezes sizes,
not contents); decode-error offsets in compressed files count decompressed bytes.
Nothing here logs: every problem is an exception for the caller to report.
"""

from __future__ import annotations

import io
import lzma
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol

import fsspec
from fsspec.core import OpenFile, split_protocol
from fsspec.registry import known_implementations
from fsspec.utils import infer_compression

#: Size of the block reads of the ``lines`` reader (a module attribute so tests can shrink it).
BLOCK_SIZE = 1 << 20

#: File extensions that mark a compressed file (one chunk per file).
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")

#: The Python package that decompresses each suffix when fsspec lacks it.
_DECOMPRESSOR_PACKAGES = {".zst": "zstandard"}

#: A chunk end that means "to the end of the stream" (used for unsplittable files).
_WHOLE = (1 << 63) - 1

Record = str | bytes


class DataError(Exception):
    """The data of a chunk cannot be read; the message is one line naming the path."""


class ChunkReadError(DataError):
    """The file cannot be opened or read: missing, I/O error, corrupt compressed stream."""


class RecordDecodeError(DataError):
    """A record is not valid in its format (e.g. invalid UTF-8)."""

    def __init__(self, message: str, *, path: str, offset: int) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


class MissingDriverError(DataError):
    """The fsspec driver for a URL's protocol is not installed (names the package)."""


class UnknownFormatError(ValueError):
    """A format name that no reader is registered under."""


@dataclass(frozen=True)
class ChunkRef:
    """A byte range ``[begin, end)`` of the file at ``path`` (local path or fsspec URL)."""

    path: str
    begin: int
    end: int

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("chunk path must not be empty")
        if self.begin < 0 or self.end < self.begin:
            raise ValueError(
                f"invalid chunk range [{self.begin}, {self.end}) of {self.path}: "
                "need 0 <= begin <= end"
            )

    @classmethod
    def of(cls, chunk: ChunkLike | Mapping[str, Any]) -> ChunkRef:
        """A ChunkRef from a ChunkRef, a ``{path, begin, end}`` mapping, or a proto ``Chunk``."""
        if isinstance(chunk, ChunkRef):
            return chunk
        if isinstance(chunk, Mapping):
            return cls(str(chunk["path"]), int(chunk["begin"]), int(chunk["end"]))
        return cls(str(chunk.path), int(chunk.begin), int(chunk.end))


class ChunkLike(Protocol):
    """Anything with ``path``, ``begin``, ``end`` (e.g. the ``Chunk`` proto message)."""

    path: str
    begin: int
    end: int


#: A reader gets a binary stream of the file and the chunk. For a splittable format the
#: stream is the raw, seekable file and the reader must apply the split rule itself; for
#: a whole-file read (unsplittable format or compressed file) the stream is at offset 0
#: and the chunk it gets is ``[0, huge)``, so it yields every record.
ReaderFn = Callable[[IO[bytes], ChunkRef], Iterator[Record]]


@dataclass(frozen=True)
class Reader:
    """A registered format: its canonical name, reader function and properties."""

    name: str
    fn: ReaderFn
    splittable: bool
    decompress: bool = True
    # yields (offset of the next record, record): where a reader of this chunk may stop
    positioned: Callable[[IO[bytes], ChunkRef], Iterator[tuple[int, Record]]] | None = None


_REGISTRY: dict[str, Reader] = {}


def register_reader(
    name: str,
    fn: ReaderFn,
    *,
    splittable: bool,
    aliases: tuple[str, ...] | list[str] = (),
    decompress: bool = True,
    replace: bool = False,
    positioned: Callable[[IO[bytes], ChunkRef], Iterator[tuple[int, Record]]] | None = None,
) -> Reader:
    """Registers ``fn`` under ``name`` and ``aliases`` (case-insensitive).

    ``decompress=False`` hands the reader the stored bytes of compressed files.
    Raises ValueError naming the clash when a name is taken and ``replace`` is false.
    """
    reader = Reader(name.lower(), fn, splittable, decompress, positioned)
    keys = [name.lower(), *(a.lower() for a in aliases)]
    taken = [k for k in keys if k in _REGISTRY and not replace]
    if taken:
        raise ValueError(f"reader format name(s) {taken} already registered")
    for key in keys:
        _REGISTRY[key] = reader
    return reader


def known_formats() -> list[str]:
    """Every registered format name and alias, sorted."""
    return sorted(_REGISTRY)


def get_reader(name: str) -> Reader:
    """The reader registered under ``name``; UnknownFormatError lists the known ones."""
    try:
        return _REGISTRY[str(name).lower()]
    except KeyError:
        raise UnknownFormatError(
            f"unknown data format {name!r}; known formats: {', '.join(known_formats())}"
        ) from None


def is_compressed(path: str) -> bool:
    """True when the path's extension is a compression this module treats as unsplittable."""
    return path.lower().endswith(COMPRESSED_SUFFIXES)


def splittable(fmt: str, path: str) -> bool:
    """Whether the master may cut ``path`` into several chunks when read as ``fmt``."""
    return get_reader(fmt).splittable and not is_compressed(path)


def resolve_filesystem(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec file system and in-filesystem path of ``path``.

    Raises MissingDriverError naming the package when the protocol's driver is not
    installed, and DataError for an unknown protocol.
    """
    protocol = split_protocol(path)[0]
    try:
        return fsspec.core.url_to_fs(path)
    except ImportError as e:
        hint = known_implementations.get(protocol or "", {}).get("err") or ""
        detail = "; ".join(dict.fromkeys(t for t in (hint, _one_line(e)) if t))
        raise MissingDriverError(
            f"cannot open {path}: the fsspec driver for {protocol}:// is not installed ({detail})"
        ) from e
    except ValueError as e:
        raise DataError(f"cannot open {path}: unsupported URL ({e})") from e


def read_chunk(chunk: ChunkRef | ChunkLike | Mapping[str, Any], fmt: str) -> Iterator[Record]:
    """Yields the records of ``chunk`` in format ``fmt`` (see the module docstring).

    Raises UnknownFormatError at once for a bad ``fmt``; DataError while iterating.
    """
    reader = get_reader(fmt)
    ref = ChunkRef.of(chunk)
    return _read(reader, ref)


def read_chunk_at(chunk: ChunkRef | ChunkLike | Mapping[str, Any], fmt: str,
                  ) -> Iterator[tuple[int | None, Record]]:
    """``read_chunk`` with, before each record, the file offset where the record after it
    starts (None where the reader cannot say: unsplittable files, readers without it)."""
    reader = get_reader(fmt)
    ref = ChunkRef.of(chunk)
    if reader.positioned is None or not reader.splittable or is_compressed(ref.path):
        return ((None, record) for record in _read(reader, ref))
    return _read(reader, ref, positioned=True)


def _read(reader: Reader, ref: ChunkRef, *, positioned: bool = False) -> Iterator[Any]:
    compressed = is_compressed(ref.path)
    whole = not reader.splittable or compressed
    if whole and ref.begin != 0:
        why = "it is compressed" if compressed else f"format {reader.name!r} reads whole files"
        raise ChunkReadError(
            f"{ref.path}: chunk [{ref.begin}, {ref.end}) starts inside a file that cannot "
            f"be split ({why}); its chunk must start at 0"
        )
    decompress = compressed and reader.decompress
    fs, fspath = resolve_filesystem(ref.path)
    effective = ChunkRef(ref.path, 0, _WHOLE) if whole else ref
    try:
        with _open(fs, fspath, ref.path, decompress=decompress) as stream:
            if positioned and reader.positioned is not None:
                yield from reader.positioned(stream, effective)
            else:
                yield from reader.fn(stream, effective)
    except RecordDecodeError as e:
        if not decompress:
            raise
        raise RecordDecodeError(
            f"{e} (offset in the decompressed data)", path=e.path, offset=e.offset
        ) from e
    except FileNotFoundError as e:
        raise ChunkReadError(f"{ref.path}: file not found") from e
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as e:
        raise ChunkReadError(
            f"{ref.path}: read error in chunk [{ref.begin}, {ref.end}): "
            f"{type(e).__name__}: {_one_line(e)}"
        ) from e


def _open(fs: fsspec.AbstractFileSystem, fspath: str, path: str, *, decompress: bool) -> OpenFile:
    """An fsspec OpenFile: as a context manager it closes the whole chain of file objects."""
    if not decompress:
        return OpenFile(fs, fspath, mode="rb")
    if infer_compression(path) is None:
        suffix = next(s for s in COMPRESSED_SUFFIXES if path.lower().endswith(s))
        package = _DECOMPRESSOR_PACKAGES.get(suffix, "the decompressor")
        raise ChunkReadError(
            f"{path}: cannot decompress {suffix} files: install {package} (pip install {package})"
        )
    return OpenFile(fs, fspath, mode="rb", compression="infer")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or repr(e)


# --- the built-in formats --------------------------------------------------------------


def _skip_partial_record(stream: IO[bytes], begin: int) -> tuple[bytearray, int]:
    """Positions after the first record start >= begin: returns (buffer, its file offset)."""
    if begin == 0:
        return bytearray(), 0
    stream.seek(begin - 1)
    offset = begin - 1
    while True:
        block = stream.read(BLOCK_SIZE)
        if not block:
            return bytearray(), offset
        newline = block.find(b"\n")
        if newline >= 0:
            return bytearray(block[newline + 1 :]), offset + newline + 1
        offset += len(block)


def _decode_line(raw: bytes | bytearray, *, path: str, offset: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordDecodeError(
            f"{path}: invalid UTF-8 at byte {offset + e.start} "
            f"(record starting at byte {offset}): {e.reason}",
            path=path,
            offset=offset + e.start,
        ) from e


def read_lines(stream: IO[bytes], chunk: ChunkRef) -> Iterator[str]:
    """The ``lines`` reader: every line starting in ``[chunk.begin, chunk.end)``, decoded."""
    for _, line in read_lines_at(stream, chunk):
        yield line


def read_lines_at(stream: IO[bytes], chunk: ChunkRef) -> Iterator[tuple[int, str]]:
    """``read_lines``, each line with the file offset just past it (its newline): where the
    next line starts."""
    buf, offset = _skip_partial_record(stream, chunk.begin)
    start = 0  # index in buf of the current record's first byte
    scan = 0  # index in buf from which no newline has been searched yet
    while offset + start < chunk.end:
        newline = buf.find(b"\n", scan)
        if newline < 0:
            block = stream.read(BLOCK_SIZE)
            if not block:
                if start < len(buf):
                    yield offset + len(buf), _decode_line(buf[start:], path=chunk.path, offset=offset + start)
                return
            del buf[:start]
            offset += start
            start = 0
            scan = len(buf)
            buf += block
            continue
        end = newline - 1 if newline > start and buf[newline - 1] == 0x0D else newline
        yield offset + newline + 1, _decode_line(buf[start:end], path=chunk.path, offset=offset + start)
        start = scan = newline + 1


def read_file(stream: IO[bytes], chunk: ChunkRef) -> Iterator[bytes]:
    """The ``file`` reader: the whole file as one ``bytes`` record."""
    out = io.BytesIO()
    while block := stream.read(BLOCK_SIZE):
        out.write(block)
    yield out.getvalue()


register_reader("lines", read_lines, splittable=True, aliases=("csv", "tsv", "jsonl", "text"),
                positioned=read_lines_at)
register_reader("file", read_file, splittable=False, decompress=False)
