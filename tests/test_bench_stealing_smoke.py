"""bench/stealing.py --quick runs end to end: both jobs (with and without work stealing)
finish with every record read exactly once, and it says what ran and where. No timing is
asserted: speed lives in the benchmark."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "stealing.py"


@pytest.mark.timeout(300)
def test_the_stealing_bench_runs_both_modes_side_by_side():
    out = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-4000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("machine: ") for line in lines), out.stdout
    assert any(line.startswith("ran: 3 stub trainers, one slowed 5x") for line in lines), out.stdout
    for mode in ("with stealing", "without"):
        row = next(line for line in lines if line.strip().startswith(mode))
        assert re.search(r"\d+\.\d s\s+\d+\s+True\s+\[0, 0, 0\]", row), row
    assert any(line.startswith("epoch time without / with stealing: ") for line in lines), out.stdout
