"""The benchmarks run end to end: one `bench/report.py --quick` runs `bench/dispatch.py`,
`bench/faults.py` and `bench/footprint.py` with `--quick` and keeps what each printed and
wrote; each part's output is checked, and the report's. No timing is asserted: speed goals
live in the benchmarks, never in tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "dispatch.py"


def test_help_names_the_options():
    out = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for option in ("--quick", "--ns", "--baseline", "--profile"):
        assert option in out.stdout


# ---- dispatch, faults, footprint and the report: one `report.py --quick` runs all three (in
# subprocesses, one after the other) and keeps their output and figures: the shape is checked ----

BENCH_DIR = BENCH.parent


def _run(script: str, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(BENCH_DIR / script), *args], capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr[-4000:]}"
    return out


def _dispatch_table(text: str) -> None:
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["N", "tasks/s"])
    assert "no-op calls/s" in lines[header] and "master/no-op" in lines[header]
    rows = [lines[header + 2].split()[0], lines[header + 3].split()[0]]
    assert rows == ["1", "4"]
    assert "start-up to health SERVING" in text
    assert "Targets" in text


def _faults(text: str, data: dict) -> None:
    for line in ("Re-queue after SIGKILL of a trainer", "Re-queue after LeaveTrainer", "Failover: two masters",
                 "re-queue after SIGKILL <= session TTL + 1 s at TTL 2 s",
                 "re-queue after LeaveTrainer <= 100 ms", "failover <= election TTL + 1 s at TTL 2 s",
                 "tasks lost across failovers: 0", "tasks double-counted across failovers: 0"):
        assert line in text, line
    assert "kill->re-queued median s" in text and "kill->standby TASK median s" in text
    (requeue,) = data["requeue"]
    assert requeue["ttl_s"] == 2 and len(requeue["runs"]) == 1
    assert requeue["runs"][0]["accepted_after"] == 2  # the poller got both tasks and finished them
    assert len(data["leave"]["runs"]) == 3
    (failover,) = data["failover"]
    assert failover["lost"] == 0 and failover["double"] == 0  # correctness, not timing
    assert failover["runs"][0]["client_accepted_twice"] == 0
    assert failover["runs"][0]["first_task_s"] is not None


def _footprint(text: str, data: dict) -> None:
    for line in ("Mid-epoch: 200 tasks", "Growth: 50 tasks x 10 epochs", "a done mark costs",
                 "compaction to the current revision", "--auto-compaction-retention 100,000",
                 "keys bounded over 10 epochs"):
        assert line in text, line
    mid, growth = data["mid"], data["growth"]
    assert mid["done_marks"] >= 100 and mid["assignments"] == 8  # half an epoch done, 8 trainers holding
    assert mid["snapshot"]["done_by_epoch"].keys() == {"1"}      # epoch 0's done marks are gone
    assert growth["epoch_ends_seen"] == 10 and growth["bounded"] and growth["old_done_max"] == 0
    assert growth["db_end"]["db_size"] > 0 and growth["db_defragged"]["db_size"] > 0


@pytest.mark.timeout(400)
def test_report_quick_runs_every_bench_and_writes_json_md_and_png(tmp_path):
    out = _run("report.py", "--quick", "--allow-tmpfs", "--out", str(tmp_path),
               "--dispatch-args=--ns 1,4", timeout=360)
    data = json.loads((tmp_path / "benchmarks.json").read_text())
    assert {"dispatch", "faults", "footprint", "goals", "meta"} <= data.keys()
    _dispatch_table("\n".join(data["dispatch"]["text"]))
    _faults("\n".join(data["faults"]["text"]), data["faults"])
    _footprint("\n".join(data["footprint"]["text"]), data["footprint"])
    goals = {g["goal"] for g in data["goals"]}
    assert any(g.startswith("re-queue after SIGKILL") for g in goals)
    assert "no task lost across a failover" in goals and "no task double-counted across a failover" in goals
    assert any(g.startswith("etcd keys bounded") for g in goals)
    assert all(g["met"] or g["why"] for g in data["goals"])  # every miss says why
    md = (tmp_path / "benchmarks.md").read_text()
    assert "## Dispatch" in md  # the hand-written part is kept
    for name in ("goals", "dispatch-run", "faults", "footprint"):
        body = md.split(f"<!-- generated:{name} -->", 1)[1].split(f"<!-- /generated:{name} -->", 1)[0]
        assert body.strip(), name
    assert "| goal | measured |" in md and "Re-queue after SIGKILL of a trainer" in md
    assert "Goals" in out.stdout and "wrote " in out.stdout
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return  # the bench extra is not installed: no plot, and the report says so
    assert (tmp_path / "benchmarks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_lease_keeper_bench_measures_both_keepers_side_by_side():
    out = _run("lease_keeper.py", "--quick", "--busy", "0", "--leases", "50", timeout=120).stdout
    header = next(line for line in out.splitlines() if line.startswith("busy coroutines"))
    assert "on the loop" in header and "own process" in header, out
    row = out.splitlines()[-1].split()
    assert row[0] == "0" and row[-1].endswith("x"), out  # both finished: a ratio, not "-"
    assert all(float(cell.replace(",", "")) > 0 for cell in row[1:3]), out


@pytest.mark.timeout(300)
def test_the_scale_bench_runs_a_row_and_two_failovers_side_by_side(tmp_path):
    """bench/scale.py --quick: one steady row, then the failover with the default flags and
    again with --failover-versus. Correctness (nothing lost or counted twice, every trainer
    served again) is checked; its timings are not."""
    figures = tmp_path / "scale.json"
    out = _run("scale.py", "--quick", "--allow-tmpfs", "--dir", str(tmp_path), "--ns", "8", "--no-expiry",
               "--no-big", "--failover-versus", "--failover-hold 0", "--json", str(figures), timeout=280).stdout
    data = json.loads(figures.read_text())
    assert [row["master"]["n"] for row in data["rows"]] == [8], out
    for key in ("failover", "failover_versus"):
        failover = data[key]
        assert (failover["lost"], failover["double"], failover["errors"]) == (0, 0, {}), out
        assert failover["served_again"] == failover["n"] and failover["reregistered"] == 0, out
    assert "flags --election-ttl 3s --session-ttl 9s --failover-hold 0, leader SIGKILLed" in out
    assert "From the standby serving to the last trainer served: " in out
