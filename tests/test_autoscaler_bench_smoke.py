"""bench/autoscale.py runs end to end at tiny sizes (--quick) and prints, writes and draws what
it should. No timing is asserted: speed goals live in the benchmark, never in tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "autoscale.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr[-4000:]}"
    return out


def test_help_names_the_options():
    out = _run("--help")
    for option in ("--quick", "--nodes", "--jobs", "--sim-nodes", "--seed", "--write-docs", "--json"):
        assert option in out.stdout


def test_quick_run_prints_both_benchmarks_and_writes_json(tmp_path):
    figures = tmp_path / "figures.json"
    out = _run("--quick", "--json", str(figures))
    text = out.stdout
    for line in ("machine: ", "Planning time: 50 nodes, 10 jobs", "Simulated day:", "autoscaler on (min..max)",
                 "off: fixed at max", "off: fixed at min", "on vs off (max)", "Goals",
                 "planning time for 50 nodes and 10 jobs < 100 ms, CPU",
                 "planning time for 50 nodes and 10 jobs < 100 ms, wall"):
        assert line in text, line
    data = json.loads(figures.read_text())
    assert len(data["planning"]["ms"]) == 2 and data["planning"]["rounds"] >= 1
    runs = {r["mode"]: r for r in data["simulation"]["runs"]}
    assert runs.keys() == {"on", "max", "min"}
    jobs = data["simulation"]["jobs"]
    assert jobs > 0 and all(r["jobs"] == jobs for r in runs.values())
    assert all(0 < r["utilisation"] <= 1 for r in runs.values())
    assert runs["on"]["resizes"] > 0 and runs["max"]["resizes"] == runs["min"]["resizes"] == 0


def test_write_docs_replaces_only_its_part(tmp_path):
    md = tmp_path / "benchmarks.md"
    md.write_text("# Benchmarks\n\nkept before\n\n<!-- generated:autoscaler -->\nold\n"
                  "<!-- /generated:autoscaler -->\n\nkept after\n")
    png = tmp_path / "autoscaler.png"
    _run("--quick", "--write-docs", str(md), "--png", str(png))
    text = md.read_text()
    assert text.startswith("# Benchmarks\n\nkept before\n") and text.endswith("kept after\n")
    body = text.split("<!-- generated:autoscaler -->", 1)[1].split("<!-- /generated:autoscaler -->")[0]
    assert "old" not in body and "Planning time:" in body and "![autoscaler on and off" in body
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return  # the bench extra is not installed: no plot, and the script says so
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
