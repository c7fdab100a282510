"""Durations and byte sizes as flags and specs take them (`paddlecloud.units`)."""

from __future__ import annotations

import re

import pytest

from paddlecloud.units import parse_duration, parse_size

pytestmark = pytest.mark.unit

# ---- parse_duration -------------------------------------------------------------------


@pytest.mark.parametrize("text, seconds", [
    ("10s", 10.0),
    ("500ms", 0.5),
    ("30m", 1800.0),
    ("1h", 3600.0),
    ("2h", 7200.0),
    ("1m30s", 90.0),
    ("1h1m1s", 3661.0),
    ("1h500ms", 3600.5),
    ("1.5h", 5400.0),
    ("0.25s", 0.25),
    ("2", 2.0),
    ("0.5", 0.5),
    ("0", 0.0),
    ("0s", 0.0),
    (" 10s ", 10.0),
    ("10S", 10.0),
    ("1M", 60.0),
    ("1ms", 0.001),
])
def test_parse_duration_reads_units_and_bare_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("value, seconds", [(5, 5.0), (0, 0.0), (0.25, 0.25)])
def test_parse_duration_takes_numbers_as_seconds(value, seconds):
    result = parse_duration(value)
    assert result == seconds and isinstance(result, float)


@pytest.mark.parametrize("text", [
    "abc", "10x", "", "   ", "s", "ms", "1h30", "10 s", "1.s", "h1", "1d", "1s2", "--1s",
])
def test_parse_duration_refuses_garbage_naming_the_value(text):
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    message = str(info.value)
    assert repr(text) in message
    assert "10s" in message, "the error says what would be right"


@pytest.mark.parametrize("value", ["-1s", "-1", "-0.5", "-1m30s", -1, -0.001])
def test_parse_duration_refuses_negative_durations_naming_the_value(value):
    with pytest.raises(ValueError, match=re.escape(repr(value))):
        parse_duration(value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "Infinity", float("nan"), float("inf")])
def test_parse_duration_refuses_values_that_are_not_finite(value):
    with pytest.raises(ValueError, match=re.escape(repr(value))):
        parse_duration(value)


# ---- parse_size -----------------------------------------------------------------------


@pytest.mark.parametrize("text, size", [
    ("64MiB", 64 * 1024**2),
    ("1GiB", 1024**3),
    ("512KB", 512_000),
    ("512KiB", 512 * 1024),
    ("4096", 4096),
    ("0", 0),
    ("10b", 10),
    ("10B", 10),
    ("1k", 1000),
    ("2M", 2_000_000),
    ("3G", 3_000_000_000),
    ("1gb", 1_000_000_000),
    ("64 MiB", 64 * 1024**2),
    (" 64mib ", 64 * 1024**2),
    ("1.5KiB", 1536),
    ("0.5GiB", 512 * 1024**2),
])
def test_parse_size_reads_decimal_and_binary_units(text, size):
    result = parse_size(text)
    assert result == size and isinstance(result, int)


@pytest.mark.parametrize("value", [0, 1, 64 * 1024**2])
def test_parse_size_takes_an_int_as_bytes(value):
    assert parse_size(value) == value


@pytest.mark.parametrize("text", ["abc", "", "MiB", "10XB", "1TiB", "-1", "-64MiB", "1.2.3",
                                  "64MiBs", "0x10", "1e3"])
def test_parse_size_refuses_garbage_naming_the_value(text):
    with pytest.raises(ValueError) as info:
        parse_size(text)
    message = str(info.value)
    assert repr(text) in message
    assert "64MiB" in message, "the error says what would be right"


def test_parse_size_refuses_a_negative_int_naming_it():
    with pytest.raises(ValueError, match=r"-1.*negative"):
        parse_size(-1)
