"""docs/metrics.md documents every metric the master exports, once, as the registry has it.

The table's rows are parsed (name, type, labels) and compared with
`master.metrics.catalog()` both ways; the names are checked against Prometheus's
conventions (https://prometheus.io/docs/practices/naming/): counters end in `_total`
and nothing else does, histograms name their unit, no label names a unit.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from master import metrics

pytestmark = pytest.mark.unit

TABLE = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(?P<name>[a-z_:]+)` \| (?P<type>\w+) \|(?P<labels>[^|]*)\| (?P<meaning>[^|]+) \|$")
UNITS = ("seconds", "bytes", "transactions", "ratio")


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in TABLE.read_text().splitlines():
        if line.startswith("| `"):
            match = ROW.match(line)
            assert match, f"not a row of name | type | labels | meaning: {line}"
            assert match["name"] not in rows, f"{match['name']} is documented twice"
            labels = tuple(re.findall(r"`([a-z_]+)`", match["labels"]))
            rows[match["name"]] = (match["type"], labels)
    return rows


def exported() -> dict[str, tuple[str, tuple[str, ...]]]:
    return {m.name: (m.type, m.labels) for m in metrics.catalog()}


def test_the_table_and_the_registry_list_the_same_metrics():
    assert documented() == exported()


@pytest.mark.parametrize("info", metrics.catalog(), ids=lambda m: m.name)
def test_every_name_keeps_prometheus_conventions(info):
    assert re.fullmatch(r"paddlecloud_[a-z]+(_[a-z]+)+", info.name)
    assert info.name.endswith("_total") == (info.type == "counter")
    if info.type == "histogram":
        assert info.name.endswith(tuple(f"_{unit}" for unit in UNITS)), "a histogram names its unit"
    for label in info.labels:
        assert not label.endswith(tuple(f"_{unit}" for unit in UNITS) + UNITS), label
    assert info.help, "every metric says what it counts"
