"""Real fleet PS jobs under faults: one `local train` of examples/wide_deep_ps per run, one fault.

    python -m tests.ps_faults [--fault trainer-kill ...] [--epochs 4]    (what `make ps-proof` runs)

Each run starts the job (2 pservers, 2 trainers, Paddle 2.6.2 from tests/paddle_ps.py), waits
until trainer 1 has trained through epoch 0, injects the fault by SIGKILL of the victim's own
program (not its launcher: a process dies as a pod's container would), and waits for the job to
end. It prints one line per run:

    fault=trainer-kill mode=async victim=trainer-1 finished=yes recovery_s=6.1 records_twice=200 ... OK

`tasks_counted`: the tasks trained to their end per epoch, which must be all of them, each
epoch. `records_twice` comes from the record lineage the example writes ($PADDLECLOUD_RECORD_LOG: each
task's `begin` and `end` on a trainer): the records of a task whose training began on a trainer
that died before it ended, and that was trained again to its end. The master counts every task
once (`tasks_counted` is checked against the data's tasks); what the model may have seen twice
is at most that cut task per dead trainer. `loss_jump` is the largest rise of a surviving
trainer's evaluation loss from one epoch to the next (a model reset shows as a jump).

Faults: `trainer-kill` (trainer 1), `trainer-kill-gloo` (trainer 1 of a job with
`PADDLE_WITH_GLOO=1`: Paddle's restarted trainer would wait for ever in `fleet.init`;
paddlecloud restarts the trainer group, so up to one cut task per trainer may reach the model
twice), `trainer0-restart` (trainer 0: Paddle's own trainer 0
would push fresh parameters over the model on its restart), `pserver-kill` (pserver 1: Paddle's
trainers abort; `--pserver-restart group` restarts the pservers and trainers from the last
checkpoint, the master's epoch with them), `pserver-kill-gloo` (the same under
`PADDLE_WITH_GLOO=1`, where saving and loading the tables takes every trainer), and `none`
(the baseline). Every run passes
`--pserver-restart group`, as a real fleet PS job should.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from processes import find  # noqa: E402

MODULE = "examples.wide_deep_ps.train"
EVAL = re.compile(r"^\[trainer (\d+)\] trainer \1: epoch (\d+) eval_loss ([\d.]+) tasks (\d+)", re.M)
# fault -> (role, id) of the victim
FAULTS = {"none": None, "trainer-kill": ("TRAINER", "1"), "trainer-kill-gloo": ("TRAINER", "1"),
          "trainer0-restart": ("TRAINER", "0"), "pserver-kill": ("PSERVER", "1"),
          "pserver-kill-gloo": ("PSERVER", "1")}
GLOO = {"trainer-kill-gloo", "pserver-kill-gloo"}  # the job's trainers in one gloo world (seed 003 Example 1's withGloo: 1)
CHUNK = 50 * 1024
TRAINERS = 2


@dataclass
class FaultRun:
    fault: str
    mode: str = "async"
    code: int | None = None
    seconds: float = 0.0
    recovery: float | None = None      # from the kill to the victim's next `end` of a task
    records_twice: int = 0
    tasks_counted: dict[int, int] = field(default_factory=dict)
    tasks_expected: int = 0
    loss_jump: float = 0.0
    console: str = ""
    why: str = ""

    @property
    def ok(self) -> bool:
        return not self.why

    def line(self) -> str:
        victim = FAULTS[self.fault]
        fields = [f"fault={self.fault}", f"mode={self.mode}",
                  f"victim={victim[0].lower() + '-' + victim[1] if victim else '-'}",
                  f"finished={'yes' if self.code == 0 else 'no'}",
                  f"seconds={self.seconds:.1f}",
                  f"recovery_s={self.recovery:.1f}" if self.recovery is not None else "recovery_s=-",
                  # after a PS group restart the model rolled back to the checkpoint: what was
                  # trained again since was trained twice, but the model saw it once
                  (f"records_retrained={self.records_twice}" if self.fault.startswith("pserver-kill")
                   else f"records_twice={self.records_twice}"), f"loss_jump={self.loss_jump:.2f}"]
        return " ".join(fields) + (" OK" if self.ok else f" ({self.why}) FAILED")


def run_fault(fault: str, *, tmp: Path, python: Path, epochs: int = 4, timeout: float = 400) -> FaultRun:
    """One job with one fault (see the module docstring); the outcome judged in `why`."""
    result = FaultRun(fault=fault)
    data, output, lineage = tmp / "data", tmp / "out", tmp / "lineage.tsv"
    subprocess.run([sys.executable, "-m", "examples.wide_deep_ps.data", str(data), "--rows", "1600"],
                   cwd=ROOT, check=True, capture_output=True)
    result.tasks_expected = sum(-(-p.stat().st_size // CHUNK) for p in data.glob("*.txt"))
    job = f"ps-{fault}-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    console = tmp / "console.txt"
    started = time.monotonic()
    with console.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "paddlecloud", "local", "train", "--module", MODULE,
             "--package-path", str(ROOT), "--python", str(python), "--pservers", "2",
             "--trainers", str(TRAINERS), "--input", str(data / "*.txt"), "--chunk-bytes", str(CHUNK),
             "--epochs", str(epochs), "--job", job, "--output", str(output), "--fresh",
             "--pserver-restart", "group",
             "-e", "PADDLECLOUD_TASK_FEED=1", "-e", f"PADDLECLOUD_RECORD_LOG={lineage}",
             *(("-e", "PADDLE_WITH_GLOO=1") if fault in GLOO else ()),
             ],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    killed_at = None
    try:
        victim = FAULTS[fault]
        if victim is not None:
            killed_at = _kill_after_first_epoch(console, job, victim, process, deadline=started + timeout,
                                                lineage=lineage if fault in GLOO else None)
        result.code = process.wait(timeout=max(1.0, started + timeout - time.monotonic()))
    except subprocess.TimeoutExpired:
        result.why = f"still running after {timeout:g}s (hung)"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in find(job, module=MODULE):
            os.kill(pid, signal.SIGKILL)
    result.seconds = time.monotonic() - started
    result.console = console.read_text(errors="replace")
    _judge(result, lineage=lineage, killed_at=killed_at, epochs=epochs)
    return result


def _kill_after_first_epoch(console: Path, job: str, victim: tuple[str, str], process: subprocess.Popen,
                            *, deadline: float, lineage: Path | None = None) -> float:
    """SIGKILLs the victim's program once trainer 1 evaluated epoch 0 (a pserver: once trainer 0
    checkpointed epoch 0 too, so the group restart has a checkpoint to restore; with `lineage`,
    once trainer 1 began a task of epoch 1: a gloo job's kill then lands in training, not in the
    epoch's end, where the trainers are in a gloo barrier together); returns when."""
    marker = "[trainer 1] trainer 1: epoch 0 eval_loss"
    checkpoint = console.parent / "out" / "checkpoints" / "checkpoint-00000000"

    def in_epoch_1() -> bool:
        return lineage is None or (lineage.exists() and any(
            line.startswith("1\t") and line.split("\t")[2:4] == ["1", "begin"]
            for line in lineage.read_text().splitlines()))

    while marker not in console.read_text(errors="replace") or not in_epoch_1() or (
            victim[0] == "PSERVER" and not checkpoint.exists()):  # a pserver: once epoch 0 is saved
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the job never reached epoch 1 (exit {process.poll()})")
        time.sleep(0.2)
    role, index = victim
    which = {"PADDLE_TRAINER_ID": index} if role == "TRAINER" else {"PADDLE_PSERVER_ID": index}
    pids = find(job, module=MODULE, TRAINING_ROLE=role, **which)
    if len(pids) != 1:
        raise RuntimeError(f"found {len(pids)} programs of {role} {index}: {pids}")
    os.kill(pids[0], signal.SIGKILL)
    return time.time()


def _judge(result: FaultRun, *, lineage: Path, killed_at: float | None, epochs: int) -> None:
    console = result.console
    lines = [line.split("\t") for line in lineage.read_text().splitlines()] if lineage.exists() else []
    begins: dict[tuple[str, str], list[int]] = {}
    for e, t, _, kind, count, _ in lines:
        if kind == "begin":
            begins.setdefault((e, t), []).append(int(count))
    # a task whose training began more than once: a fault cut the first and it was trained again
    result.records_twice = sum(sum(counts[1:]) for counts in begins.values())
    for epoch in sorted({int(e) for e, _, _, kind, _, _ in lines if kind == "end"}):
        result.tasks_counted[epoch] = len({t for e, t, _, kind, _, _ in lines
                                           if kind == "end" and int(e) == epoch})
    largest_task = max((max(counts) for counts in begins.values()), default=0)
    losses: dict[str, list[float]] = {}
    for trainer, _, loss, _ in EVAL.findall(console):
        losses.setdefault(trainer, []).append(float(loss))
    survivor = "1" if FAULTS[result.fault] == ("TRAINER", "0") else "0"
    series = losses.get(survivor, [])
    result.loss_jump = max((b - a for a, b in zip(series, series[1:], strict=False)), default=0.0)
    victim = FAULTS[result.fault]
    if killed_at is not None and victim is not None:  # a pserver's recovery: trainer 1's next task
        result.recovery = _recovery(lineage, victim[1] if victim[0] == "TRAINER" else "1", killed_at)
    if result.why:
        return
    if result.code != 0:
        result.why = f"local train exited {result.code}"
    elif "succeeded" not in console.splitlines()[-1]:
        result.why = "the job did not succeed"
    elif result.tasks_counted != {e: result.tasks_expected for e in range(epochs)}:
        result.why = f"tasks trained per epoch {result.tasks_counted}, not {result.tasks_expected} each"
    elif victim is not None and victim[0] == "TRAINER" and (
            f"trainer {survivor} exited" in console or "aborted without its gloo peer" in console):
        result.why = f"the surviving trainer {survivor} died too"
    elif result.fault == "trainer-kill-gloo" and "restarting the trainer group" not in console:
        result.why = "no trainer group restart"
    elif console.count("): stopping the pserver") != 2 or "still hold sessions" in console:
        result.why = "paddlecloud did not stop both pservers once the trainers left"
    elif not series or series[-1] > 2.0:
        result.why = f"trainer {survivor}'s loss did not fall: {series}"
    elif result.loss_jump > 1.0:
        result.why = f"trainer {survivor}'s loss jumped back by {result.loss_jump:.2f}: the model was reset"
    elif result.fault.startswith("pserver-kill") and "PS group restart 1" not in console:
        result.why = "no PS group restart"
    elif result.fault.startswith("pserver-kill") and "loaded the checkpoint of epoch" not in console:
        result.why = "the restarted pservers did not get the checkpoint's tables"
    elif not result.fault.startswith("pserver-kill") and result.records_twice > _cut_tasks(result.fault) * largest_task:
        result.why = f"{result.records_twice} records trained twice: more than the cut tasks'"


def _cut_tasks(fault: str) -> int:
    """How many tasks a fault may cut (each may reach the model twice): none without a fault,
    the dead trainer's, and under gloo each trainer's (the group is restarted)."""
    if FAULTS[fault] is None:
        return 0
    return TRAINERS if fault in GLOO else 1


def _recovery(lineage: Path, victim: str, killed_at: float) -> float | None:
    """Seconds from the kill until the victim (restarted) ended its next task's training."""
    if not lineage.exists():
        return None
    after = [float(at) for _, _, trainer, kind, _, at in (line.split("\t") for line in
             lineage.read_text().splitlines()) if trainer == victim and kind == "end" and float(at) > killed_at]
    return min(after) - killed_at if after else None


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from paddle_ps import missing, venv_dir

    parser = argparse.ArgumentParser(prog="python -m tests.ps_faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", action="append", choices=sorted(FAULTS))
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args(argv)
    why = missing()
    if why:
        print(f"no PS-capable Paddle: {why}", file=sys.stderr)
        return 2
    failed = 0
    for fault in args.fault or ["trainer-kill", "trainer-kill-gloo", "trainer0-restart", "pserver-kill",
                                "pserver-kill-gloo"]:
        with tempfile.TemporaryDirectory(prefix=f"ps-proof-{fault}-") as tmp:
            run = run_fault(fault, tmp=Path(tmp), python=venv_dir() / "bin" / "python", epochs=args.epochs)
        print(run.line(), flush=True)
        if not run.ok:
            print("\n".join(run.console.splitlines()[-30:]), file=sys.stderr)
        failed += not run.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
