"""Shard readers: the split rule over arbitrary cuts, formats, compression, errors."""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import lzma
import os
import uuid
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import fsspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_agent import readers
from trainer_agent.readers import (
    ChunkReadError,
    ChunkRef,
    DataError,
    MissingDriverError,
    RecordDecodeError,
    UnknownFormatError,
    get_reader,
    is_compressed,
    read_chunk,
    register_reader,
    splittable,
)

# --- helpers --------------------------------------------------------------------------


def _write(tmp_path: Path, data: bytes, name: str = "data.csv") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _read(path: str, begin: int, end: int, fmt: str = "lines") -> list:
    return list(read_chunk(ChunkRef(path, begin, end), fmt))


def _read_cut(path: str, size: int, chunk: int) -> list[str]:
    """Reads the file cut into chunks [k*chunk, min((k+1)*chunk, size)) and concatenates."""
    out: list[str] = []
    for begin in range(0, size, chunk):
        out.extend(_read(path, begin, min(begin + chunk, size)))
    return out


# --- the property: any cut gives every record exactly once ----------------------------

_record_text = st.text(
    alphabet=st.one_of(
        st.sampled_from(list("ab,\t é€😀")),
        st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)),
    ),
    max_size=12,
)


@st.composite
def _text_files(draw) -> tuple[bytes, list[str]]:
    """(file bytes, its records): random lines, empty ones, LF/CRLF, maybe no final newline."""
    records = draw(st.lists(_record_text, max_size=30))
    endings = [draw(st.sampled_from(["\n", "\r\n"])) for _ in records]
    if records and not draw(st.booleans()):
        endings[-1] = ""  # no trailing newline
        if records[-1] == "":
            records = records[:-1]  # an empty last line without a newline is no record
            endings = endings[:-1]
    text = "".join(r + e for r, e in zip(records, endings, strict=True))
    return text.encode("utf-8"), records


@pytest.mark.unit
@pytest.mark.parametrize("where", ["local", "memory"])
@settings(max_examples=200, deadline=None)
@given(data=st.data(), file=_text_files())
def test_any_cut_yields_every_record_exactly_once(where, data, file, tmp_path_factory):
    raw, records = file
    chunk = data.draw(st.integers(1, len(raw) + 3), label="chunk size")
    block = data.draw(st.integers(1, 16), label="read block size")
    if where == "local":
        path = _write(tmp_path_factory.mktemp("prop"), raw)
    else:
        path = f"memory://readers-prop/{uuid.uuid4().hex}.csv"
        fsspec.filesystem("memory").pipe(path, raw)
    try:
        with mock.patch.object(readers, "BLOCK_SIZE", block):
            assert _read_cut(path, len(raw), chunk) == records
            assert _read(path, 0, len(raw)) == records
            assert _read(path, 0, len(raw) + 5) == records  # an end past EOF is harmless
    finally:
        if where == "memory":
            fsspec.filesystem("memory").rm(path)


# --- the split rule, case by case ------------------------------------------------------


@pytest.mark.unit
def test_file_without_trailing_newline(tmp_path):
    path = _write(tmp_path, b"alpha\nbeta")
    assert _read(path, 0, 10) == ["alpha", "beta"]
    assert _read(path, 0, 7) == ["alpha", "beta"]
    assert _read(path, 0, 6) == ["alpha"]  # "beta" starts at byte 6
    assert _read(path, 6, 10) == ["beta"]
    assert _read(path, 7, 10) == []


@pytest.mark.unit
def test_chunk_at_a_record_start_and_one_byte_after(tmp_path):
    path = _write(tmp_path, b"aa\nbb\ncc\n")  # records start at 0, 3, 6
    assert _read(path, 3, 6) == ["bb"]
    assert _read(path, 3, 4) == ["bb"]  # a record may extend past the chunk's end
    assert _read(path, 4, 6) == []  # bb started before, cc starts at the end
    assert _read(path, 4, 7) == ["cc"]
    assert _read(path, 2, 3) == []  # the newline byte itself starts nothing
    assert _read(path, 9, 9) == []


@pytest.mark.unit
def test_empty_file(tmp_path):
    path = _write(tmp_path, b"")
    assert _read(path, 0, 0) == []
    assert _read(path, 0, 0, "file") == [b""]


@pytest.mark.unit
def test_empty_lines_are_records_and_crlf_is_stripped(tmp_path):
    path = _write(tmp_path, b"\n\r\nx\r\n\n")
    assert _read(path, 0, 8) == ["", "", "x", ""]
    assert _read_cut(path, 8, 1) == ["", "", "x", ""]


@pytest.mark.unit
def test_a_lone_carriage_return_is_data(tmp_path):
    path = _write(tmp_path, b"a\rb\nc\r")
    assert _read(path, 0, 7) == ["a\rb", "c\r"]


@pytest.mark.unit
def test_multibyte_utf8_split_inside_a_character(tmp_path):
    raw = "é€\n😀x\n".encode()
    path = _write(tmp_path, raw)
    for cut in range(1, len(raw)):
        assert _read(path, 0, cut) + _read(path, cut, len(raw)) == ["é€", "😀x"], cut


@pytest.mark.unit
def test_records_longer_than_the_read_block(tmp_path):
    lines = ["x" * 2_500_000, "", "y" * 1_200_000]
    raw = "\n".join(lines).encode()
    path = _write(tmp_path, raw)
    assert _read_cut(path, len(raw), 1 << 20) == lines


@pytest.mark.unit
def test_accepts_mappings_and_proto_like_chunks(tmp_path):
    path = _write(tmp_path, b"a\nb\n")
    assert list(read_chunk({"path": path, "begin": 2, "end": 4}, "csv")) == ["b"]
    chunk = SimpleNamespace(path=path, begin=0, end=1)
    assert list(read_chunk(chunk, "tsv")) == ["a"]


@pytest.mark.unit
@pytest.mark.parametrize("begin,end", [(-1, 3), (5, 4)])
def test_chunk_ref_rejects_bad_ranges(begin, end):
    with pytest.raises(ValueError, match=rf"\[{begin}, {end}\)"):
        ChunkRef("/x", begin, end)


# --- formats and compression -----------------------------------------------------------


@pytest.mark.unit
def test_file_format_yields_the_whole_file_as_bytes(tmp_path):
    raw = b"\x00\xffbinary\nstuff"
    path = _write(tmp_path, raw, "blob.bin")
    assert _read(path, 0, len(raw), "file") == [raw]
    assert _read(path, 0, 1, "FILE") == [raw]  # names are case-insensitive
    with pytest.raises(ChunkReadError, match="cannot be split"):
        _read(path, 3, len(raw), "file")


@pytest.mark.parametrize("suffix,compress", [(".gz", gzip.compress), (".bz2", bz2.compress),
                                             (".xz", lzma.compress)])
@pytest.mark.unit
def test_compressed_files_are_read_whole(tmp_path, suffix, compress):
    lines = [f"row {i},é" for i in range(2000)] + [""]
    stored = compress(("\r\n".join(lines) + "\n").encode())
    path = _write(tmp_path, stored, "part" + suffix)
    assert len(stored) < sum(map(len, lines))  # end < decompressed size: end is ignored
    assert _read(path, 0, len(stored)) == lines
    assert _read(path, 0, len(stored), "file") == [stored]  # `file` keeps stored bytes
    with pytest.raises(ChunkReadError, match="cannot be split"):
        _read(path, 1, len(stored))


@pytest.mark.skipif(importlib.util.find_spec("zstandard") is None,
                    reason="zstandard missing: pip install -e '.[zstd]' (the test extra has it)")
@pytest.mark.unit
def test_zstd_file_is_read_whole(tmp_path):
    import zstandard

    stored = zstandard.ZstdCompressor().compress(b"a\nb\n")
    path = _write(tmp_path, stored, "part.zst")
    assert _read(path, 0, len(stored)) == ["a", "b"]


@pytest.mark.unit
def test_zstd_without_zstandard_names_the_package(tmp_path, monkeypatch):
    import fsspec.utils

    monkeypatch.delitem(fsspec.utils.compressions, "zst", raising=False)  # as fsspec without zstandard
    path = _write(tmp_path, b"\x28\xb5\x2f\xfdnot really", "part.zst")
    with pytest.raises(DataError, match=r"part\.zst.*zstandard"):
        _read(path, 0, 10)


@pytest.mark.unit
def test_splittable_and_is_compressed():
    assert splittable("csv", "/d/a.csv") and splittable("lines", "memory://x/a.jsonl")
    assert not splittable("file", "/d/a.csv")
    for path in ["/d/a.csv.gz", "s3://b/a.BZ2", "/d/a.xz", "/d/a.jsonl.zst"]:
        assert is_compressed(path) and not splittable("csv", path), path
    assert not is_compressed("/d/gz.csv")


@pytest.mark.unit
def test_unknown_format_names_it_and_lists_known():
    with pytest.raises(UnknownFormatError, match=r"'parquet'.*csv.*file.*lines") as e:
        read_chunk(ChunkRef("/x", 0, 1), "parquet")
    assert isinstance(e.value, ValueError)


@pytest.fixture
def registry():
    saved = dict(readers._REGISTRY)
    yield
    readers._REGISTRY.clear()
    readers._REGISTRY.update(saved)


@pytest.mark.unit
def test_register_a_custom_format(tmp_path, registry):
    def words(stream, chunk):
        yield from stream.read().split()

    register_reader("words", words, splittable=False, aliases=("ws",))
    path = _write(tmp_path, b"a b  c")
    assert _read(path, 0, 6, "WS") == [b"a", b"b", b"c"]
    assert get_reader("words").name == "words" and not splittable("ws", path)
    with pytest.raises(ValueError, match="ws"):
        register_reader("other", words, splittable=True, aliases=("ws",))


# --- errors ----------------------------------------------------------------------------


@pytest.mark.unit
def test_a_vanished_file_names_the_path(tmp_path):
    path = _write(tmp_path, b"a\n")
    os.remove(path)
    with pytest.raises(DataError, match=f"^{path}: file not found$"):
        _read(path, 0, 2)


@pytest.mark.unit
def test_invalid_utf8_names_path_and_offset(tmp_path):
    path = _write(tmp_path, b"ok\nab\xff\xfe\nlater\n")
    records = read_chunk(ChunkRef(path, 0, 20), "lines")
    assert next(records) == "ok"  # records before the bad one still come out
    with pytest.raises(RecordDecodeError, match=f"^{path}: invalid UTF-8 at byte 5 ") as e:
        next(records)
    assert (e.value.path, e.value.offset) == (path, 5)
    assert "\n" not in str(e.value)


@pytest.mark.unit
def test_corrupt_gzip_names_the_path(tmp_path):
    stored = gzip.compress("".join(f"{i}\n" for i in range(10_000)).encode())
    path = _write(tmp_path, stored[: len(stored) // 2], "cut.csv.gz")
    with pytest.raises(ChunkReadError, match=f"^{path}: read error") as e:
        _read(path, 0, len(stored) // 2)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is not None, reason="pyarrow installed")
def test_missing_hdfs_driver_names_the_package():
    with pytest.raises(MissingDriverError, match=r"hdfs://nn/data/a\.csv.*pyarrow"):
        _read("hdfs://nn/data/a.csv", 0, 10)


@pytest.mark.unit
@pytest.mark.skipif(importlib.util.find_spec("s3fs") is not None, reason="s3fs installed")
def test_missing_s3_driver_names_the_package():
    with pytest.raises(MissingDriverError, match="s3fs"):
        _read("s3://bucket/a.csv", 0, 10)


@pytest.mark.unit
def test_unknown_url_scheme_is_a_data_error():
    with pytest.raises(DataError, match=r"nosuch://x/a\.csv.*nosuch"):
        _read("nosuch://x/a.csv", 0, 10)
