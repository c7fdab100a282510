"""Recovery from a lost trainer: paddlecloud against PaddlePaddle's own elastic launcher.

The same small collective job — fit-a-line (13 features, 20,000 records), 2 trainers on
CPU over gloo, batches of 64, 20 ms per step, 3 epochs — run two ways on this machine:

* **paddlecloud**: `paddlecloud local train --example fit-a-line --checkpoint-every 6`
  (the master deals 64 KiB tasks; the group checkpoints every 6 tasks of the job).
* **paddle.distributed.launch**: two launchers in elastic mode, `--master etcd://...
  --nnodes 2:3 --elastic_level 1 --max_restart 3`, running bench/launch_fit_a_line.py (each
  rank reads its own shard; rank 0 checkpoints at each epoch's end; every rank resumes
  from it), as a Paddle user writes it.

Once the job is 20 steps into epoch 1, trainer 1's process is SIGKILLed. Measured, for
each: the seconds from the kill until the job trains again (its first step after the
kill), whether it finished, the records of each epoch read twice and never (in the final
model's lineage: the steps a restart undid dropped, tests/chaos/lineage.py), and the final
loss. For paddlecloud also the parts of the recovery (MARKS), each from the mark before it:
detection, group stop, epoch restart, launcher, Paddle import, gloo init, checkpoint load,
first step; marks from its console (stamped as lines arrive), /proc (the old group gone,
the new commands' start times) and the example's DEBUG lines (`--log-level DEBUG`), with
the median of each over the runs. `--baseline TREE` runs paddlecloud's side with an earlier
source tree too, alternating with this one: before and after in one run.

    python bench/recovery.py            # one run of each
    python bench/recovery.py --runs 3
    python bench/recovery.py --only paddlecloud --runs 5 --baseline /tmp/before [--timeline]

Needs the paddle extra, and for the launcher its etcd client, the `etcd3` package, installed
without its dependencies (it pins grpcio 1.27 and protobuf 3.6, which would replace this
project's): `pip install --no-deps etcd3 six`; without it the launcher's side is skipped,
saying so. The launcher runs with `PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python`, which
this sets for it: etcd3's generated code predates protobuf 4's C++ descriptors. What this does NOT measure:
Kubernetes (pod scheduling and image pulls dominate there), or a loss without a
checkpoint of the launcher's own (the script here saves at each epoch's end).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from chaos.lineage import audit_lineage, lineage, record_ids  # noqa: E402
from processes import find, gone, job_processes  # noqa: E402

from examples.fit_a_line.consumed import read_entries  # noqa: E402
from paddlecloud.etcd_server import EtcdServer  # noqa: E402

EPOCHS = 3
STEP_DELAY = "0.02"
KILL_AFTER_STEPS = 20       # steps of epoch 1 before the kill
RECOVERY_DEADLINE = 120.0   # seconds a job gets to train again after the kill
EXAMPLE = "examples.fit_a_line.train"
BASELINE = "paddlecloud (--baseline)"


@dataclass
class Run:
    """One job's run: its timeline after the kill (seconds from the kill) and its audit."""

    name: str
    recovered_after: float | None = None    # first step after the kill
    finished: bool = False
    exit_codes: list[int] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)
    twice: list[int] = field(default_factory=list)   # per epoch
    never: list[int] = field(default_factory=list)
    final_loss: float | None = None
    note: str = ""
    recovery_lines: list[str] = field(default_factory=list)  # the console's, kill to first step


class Console:
    """A child's output, each line stamped with time.time() as it arrives."""

    def __init__(self, process: subprocess.Popen, path: Path) -> None:
        self.lines: list[tuple[float, str]] = []
        self._out = open(path, "w")
        self._thread = threading.Thread(target=self._pump, args=(process,), daemon=True)
        self._thread.start()

    def _pump(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))
            self._out.write(line)
        self._out.close()

    def first(self, pattern: str, after: float) -> float | None:
        for at, line in list(self.lines):
            if at >= after and re.search(pattern, line):
                return at
        return None

    def last_of_each(self, pattern: str, after: float, whom: set[str]) -> float | None:
        """When the line matching `pattern` came from the last of `whom` ("trainer 0", ...)."""
        seen: dict[str, float] = {}
        for at, line in list(self.lines):
            who = re.match(r"\[([^\]]+)\] ", line)
            if at >= after and who and who[1] in whom and who[1] not in seen and re.search(pattern, line):
                seen[who[1]] = at
        return max(seen.values()) if seen.keys() == whom else None

    def join(self) -> None:
        self._thread.join(timeout=30)


class StepLog:
    """The example's consumed log, each entry stamped when it was first seen (polled)."""

    def __init__(self, path: Path, *, group_restarts: bool = True) -> None:
        self.path = path
        self.seen: list[tuple[float, dict]] = []
        # False: a job that goes on without a restart (no `resumed` entry will come)
        self.group_restarts = group_restarts

    def poll(self) -> None:
        entries = read_entries(self.path)
        now = time.time()
        self.seen += [(now, e) for e in entries[len(self.seen):]]

    def steps_in(self, epoch: int) -> int:
        return sum(1 for _, e in self.seen if e.get("epoch") == epoch and "ids" in e)

    def first_step_after(self, moment: float) -> float | None:
        """When the first step logged after `moment` by a group started after it (behind a
        `resumed` entry, when any comes: the survivors' steps in flight at the kill are not
        training again) was seen."""
        later = [(at, e) for at, e in self.seen if at > moment]
        resumed = next((i for i, (_, e) in enumerate(later) if "resumed" in e), None)
        if resumed is not None:
            later = later[resumed:]
        elif self.group_restarts:
            return None  # only the survivors' last steps so far
        return next((at for at, e in later if "ids" in e), None)


def wait(predicate, *, timeout: float, poll: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return False


def audit(run: Run, log: Path, data: Path) -> None:
    for epoch in audit_lineage(lineage(log), record_ids(data), epochs=EPOCHS):
        run.twice.append(epoch.seen_twice)
        run.never.append(epoch.never_seen)


def last_loss(text: str) -> float | None:
    losses = re.findall(r"epoch (\d+) loss ([0-9.]+)", text)
    return float(losses[-1][1]) if losses else None


# The recovery's marks on paddlecloud's side, in order; each part of the recovery is the time
# from the mark before it (the kill, for the first). A mark of the group is its last member's.
MARKS = (
    ("detection", "the supervisor says a trainer died"),
    ("group stop", "the old group's processes are gone"),
    ("epoch restart", "the master restarted the checkpoint's epoch"),
    ("launcher", "the new launchers started their commands"),
    ("Paddle import", "the trainers imported their modules"),
    ("gloo init", "the trainers joined the new group"),
    ("checkpoint load", "the trainers loaded the checkpoint"),
    ("first step", "the new group's first step"),
)


def paddlecloud_run(work: Path, data: Path, *, tree: Path = ROOT, name: str = "paddlecloud") -> Run:
    """paddlecloud's side, with the paddlecloud of source tree `tree` (the trainers run this
    tree's example, which logs the start's marks, first on their path in either case)."""
    run = Run(name)
    job = f"recovery-{os.getpid()}-{int(time.time())}"
    out, log = work / f"pc-{len(name)}", work / f"pc-{len(name)}-consumed.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "paddlecloud", "local", "train", "--job", job,
         "--module", EXAMPLE, "--package-path", str(ROOT), "--input", str(data / "*.csv"),
         "--output", str(out), "--epochs", str(EPOCHS), "--trainers", "2", "--chunk-bytes", "64KiB",
         "--checkpoint-every", "6", "-e", f"FIT_A_LINE_CONSUMED_LOG={log}",
         "--", "--step-delay", STEP_DELAY, "--log-level", "DEBUG"],  # DEBUG: the start's marks
        # cwd: no tree's (`python -m` puts it first on the path, before PYTHONPATH)
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work,
        env=dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200",
                 PYTHONPATH=os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)))
    console, steps = Console(process, work / "pc-console.txt"), StepLog(log)
    try:
        if not wait(lambda: (steps.poll(), steps.steps_in(1) >= KILL_AFTER_STEPS)[1], timeout=300):
            run.note = "never reached epoch 1"
            return run
        victim = find(job, module=EXAMPLE, PADDLE_TRAINER_ID="1")
        old_group = trainer_processes(job)
        killed = time.time()
        os.kill(victim[0], signal.SIGKILL)
        group_gone: list[float] = []

        def trains_again() -> bool:
            steps.poll()
            if not group_gone and all(gone(pid) for pid in old_group):
                group_gone.append(time.time())
            return steps.first_step_after(killed) is not None

        wait(trains_again, timeout=RECOVERY_DEADLINE)
        first = steps.first_step_after(killed)
        run.recovered_after = None if first is None else first - killed
        commands = [started_at(pid) for pid in trainer_processes(job, module=EXAMPLE)
                    if pid not in old_group]
        process.wait(timeout=600)
        steps.poll()
        console.join()
        run.exit_codes = [process.returncode]
        run.finished = process.returncode == 0
        group = {f"trainer {i}" for i in range(2)}
        marks = [
            console.first(r"\[local\] trainer \d+ died", killed),
            group_gone[0] if group_gone else None,
            console.first(r"the master restarted epoch", killed),
            max(commands) if len(commands) == len(group) else None,
            console.last_of_each(r"DEBUG __main__: imports done", killed, group),
            console.last_of_each(r"DEBUG __main__: joined the group", killed, group),
            console.last_of_each(r"resumed from the checkpoint", killed, group),
            first,
        ]
        before = killed
        for (name, _), mark in zip(MARKS, marks, strict=True):
            if mark is None or before is None:
                before = mark
                continue
            run.parts[name] = mark - before
            before = mark
        audit(run, log, data)
        run.final_loss = last_loss("\n".join(line for _, line in console.lines if "[trainer 0]" in line))
        run.recovery_lines = [f"{at - killed:+7.2f} s  {line}" for at, line in console.lines
                              if killed <= at <= (first or at)]
    finally:
        if process.poll() is None:
            process.kill()
        for pid, _, _ in job_processes(job):
            os.kill(pid, signal.SIGKILL)
    return run


def trainer_processes(job: str, *, module: str | None = None) -> set[int]:
    """The job's trainer launchers and commands (`module`: the commands running it only)."""
    return {pid for pid, argv, env in job_processes(job) if "PADDLE_TRAINER_ID" in env
            and (module is None or argv[1:3] == ["-m", module])}


def started_at(pid: int) -> float:
    """When process `pid` started (time.time()'s clock), from /proc (in clock ticks since boot)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def launcher_run(work: Path, data: Path) -> Run:
    run = Run("paddle.distributed.launch")
    out = work / "pl"
    out.mkdir()
    etcd = EtcdServer(str(work / "pl-etcd"))
    etcd.start()
    job = f"recovery-{os.getpid()}"
    env = dict(os.environ, PYTHONUNBUFFERED="1", PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    launchers = []
    try:
        for i in range(2):
            launchers.append(subprocess.Popen(
                [sys.executable, "-m", "paddle.distributed.launch", "--master",
                 etcd.endpoint.replace("http://", "etcd://"), "--job_id", job, "--nnodes", "2:3",
                 "--nproc_per_node", "1", "--elastic_timeout", "5", "--elastic_level", "1",
                 "--max_restart", "3", "--log_dir", str(work / f"pl-logs-{i}"),
                 str(ROOT / "bench" / "launch_fit_a_line.py"), str(data), str(out),
                 "--epochs", str(EPOCHS), "--step-delay", STEP_DELAY],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env))
        consoles = [Console(p, work / f"pl-console-{i}.txt") for i, p in enumerate(launchers)]
        steps = StepLog(out / "consumed.jsonl")
        if not wait(lambda: (steps.poll(), steps.steps_in(1) >= KILL_AFTER_STEPS)[1], timeout=300):
            run.note = "never reached epoch 1"
            return run
        victim = _launched_trainer(launchers[1].pid)
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        wait(lambda: (steps.poll(), steps.first_step_after(killed) is not None
                      or all(p.poll() is not None for p in launchers))[1], timeout=RECOVERY_DEADLINE)
        first = steps.first_step_after(killed)
        run.recovered_after = None if first is None else first - killed
        for process in launchers:
            try:
                process.wait(timeout=300 if first is not None else 60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for console in consoles:
            console.join()
        steps.poll()
        run.exit_codes = [p.returncode for p in launchers]
        text = "\n".join(line for c in consoles for _, line in c.lines)
        run.finished = all(code == 0 for code in run.exit_codes) and f"epoch {EPOCHS - 1} loss" in (
            _worker_logs(work))
        run.note = _why(text)
        audit(run, out / "consumed.jsonl", data)
        run.final_loss = last_loss(_worker_logs(work))
    finally:
        for process in launchers:
            if process.poll() is None:
                process.kill()
        etcd.stop()
    return run


def _launched_trainer(launcher: int) -> int:
    """The training script a launcher runs (its child that runs launch_fit_a_line.py)."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    for pid in children:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if any(a.endswith(b"launch_fit_a_line.py") for a in argv):
            return int(pid)
    raise RuntimeError(f"launcher {launcher} runs no trainer now")


def _worker_logs(work: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(work.glob("pl-logs-*/workerlog.*")))


def _why(text: str) -> str:
    """The launchers' own words for how the run ended."""
    found = [m for m in ("peer not ready", "Container failed", "Pod completed", "Pod failed")
             if m in text]
    return ", ".join(found)


def report(runs: list[Run]) -> None:
    print(f"{'job':28} {'trains again after':>18} {'finished':>8} {'read twice':>12} "
          f"{'never read':>12} {'final loss':>10}  exit, notes")
    for r in runs:
        again = f"{r.recovered_after:.1f} s" if r.recovered_after is not None else "never"
        loss = f"{r.final_loss:.4f}" if r.final_loss is not None else "-"
        print(f"{r.name:28} {again:>18} {str(r.finished):>8} {str(r.twice):>12} {str(r.never):>12} "
              f"{loss:>10}  {r.exit_codes} {r.note}")
    sides = {name: [r for r in runs if r.name == name] for name in (BASELINE, "paddlecloud")}
    sides = {name: side for name, side in sides.items() if any(r.parts for r in side)}
    if sides:
        parts_table(sides)


def parts_table(sides: dict[str, list[Run]]) -> None:
    """paddlecloud's recovery in parts, per side: the median of each part over the runs (and
    every run's value), then the time until it trains again."""
    print("paddlecloud's recovery in parts: seconds, each from the mark before it (the kill for the "
          "first); the median, then each run's")
    print(f"  {'part':16} " + " ".join(f"{name:34}" for name in sides) + " ends when")
    rows = [(name, ends, lambda r, name=name: r.parts.get(name)) for name, ends in MARKS]
    rows.append(("trains again", "(the sum: from the kill)", lambda r: r.recovered_after))
    for name, ends, value in rows:
        cells = []
        for side in sides.values():
            values = [v for v in map(value, side) if v is not None]
            median = f"{statistics.median(values):5.2f}" if values else "    -"
            cells.append(f"{median} ({' '.join(f'{v:.2f}' for v in values)})"[:34])
        print(f"  {name:16} " + " ".join(f"{c:34}" for c in cells) + f" {ends}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--only", choices=("paddlecloud", "launcher"), default=None,
                        help="run one side only")
    parser.add_argument("--timeline", action="store_true",
                        help="print paddlecloud's console from the kill to the first step, timed")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="also run paddlecloud's side with the source tree DIR (an earlier commit: "
                             "git archive COMMIT | tar -x -C DIR), alternating with this tree's")
    args = parser.parse_args(argv)
    if args.baseline and not (args.baseline / "paddlecloud" / "__init__.py").is_file():
        parser.error(f"--baseline {str(args.baseline)[:200]}: not a paddlecloud source tree")
    import paddle

    print(f"machine: {os.cpu_count()} cores; PaddlePaddle {paddle.__version__}; python "
          f"{sys.version.split()[0]}; the kill after {KILL_AFTER_STEPS} steps of epoch 1", flush=True)
    runs: list[Run] = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="paddlecloud-recovery-") as scratch:
            work = Path(scratch)
            data = work / "data"
            subprocess.run([sys.executable, "-m", "examples.fit_a_line.data", str(data)],
                           check=True, capture_output=True, cwd=ROOT)
            if args.only != "launcher" and args.baseline:
                runs.append(paddlecloud_run(work, data, tree=args.baseline.resolve(),
                                            name=BASELINE))
            if args.only != "launcher":
                runs.append(paddlecloud_run(work, data))
            if args.only != "paddlecloud" and not importlib.util.find_spec("etcd3"):
                print("skipping paddle.distributed.launch: its etcd client is missing "
                      "(pip install --no-deps etcd3 six)", flush=True)
            elif args.only != "paddlecloud":
                runs.append(launcher_run(work, data))
    if args.timeline:
        for r in runs:
            print(f"{r.name}'s console after the kill:", *r.recovery_lines, sep="\n  ")
    report(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
