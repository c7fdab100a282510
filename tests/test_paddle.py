"""Real PaddlePaddle against a real master: MasterDataset, loader workers, the collective example."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

paddle = pytest.importorskip("paddle")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from masters import pb, stub, wait_serving  # noqa: E402

from paddlecloud.etcd_server import free_port  # noqa: E402
from paddlecloud.master_client.discovery import MasterLocator  # noqa: E402
from trainer_agent.checkpoint import TrainStatus, latest_train_status  # noqa: E402
from trainer_agent.client import TaskClient  # noqa: E402
from trainer_agent.paddle import (  # noqa: E402
    MasterDataset,
    load_paddle_checkpoint,
    save_paddle_checkpoint,
)

pytestmark = pytest.mark.paddle

REPO = Path(__file__).resolve().parents[1]
EPOCH_LINE = re.compile(r"^epoch (\d+) loss ([0-9.]+) examples (\d+) \(trainer (\S+): (\d+)\)$", re.M)


def serving(proc):
    asyncio.run(wait_serving(proc.address, process=proc))
    return proc


def status(proc) -> pb.GetStatusResponse:
    with grpc.insecure_channel(proc.address) as channel:
        return stub(channel).GetStatus(pb.GetStatusRequest())


def trainer_ids(proc) -> list[str]:
    with grpc.insecure_channel(proc.address) as channel:
        reply = stub(channel).ListTrainers(pb.ListTrainersRequest(page_size=100))
    return [t.trainer_id for t in reply.trainers]


def factory_for(proc):
    """A client factory of the shape MasterDataset calls: (trainer_id=..., parse=...)."""
    return functools.partial(TaskClient, locator=MasterLocator(master_endpoint=proc.address),
                             deadline=60)


WEIGHTS = np.array([1.5, -2.0, 0.5], dtype=np.float32)
BIAS = 0.25


def write_linear_data(directory: Path, *, files: int, rows: int) -> int:
    """CSV lines `id,x1,x2,x3,y` of y = w.x + b + small noise; returns the number of rows."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(7)
    for f in range(files):
        x = rng.standard_normal((rows, 3)).astype(np.float32)
        y = x @ WEIGHTS + BIAS + rng.normal(0, 0.05, rows)
        lines = [f"{f}-{i}," + ",".join(f"{v:.5f}" for v in (*x[i], y[i])) for i in range(rows)]
        (directory / f"part-{f:03d}.csv").write_text("\n".join(lines) + "\n")
    return files * rows


def parse_row(line: str):
    """(features, label) of a `id,x1,x2,x3,y` line."""
    values = np.array(line.split(",")[1:], dtype=np.float32)
    return values[:3], values[3:]


def parse_row_with_origin(line: str):
    """(row number, loader worker id, x, y): which worker process read the record."""
    file, row = line.split(",", 1)[0].split("-")
    info = paddle.io.get_worker_info()
    x, y = parse_row(line)
    return np.int64(int(file) * 100_000 + int(row)), np.int64(-1 if info is None else info.id), x, y


def test_paddle_checkpoint_round_trip_restores_model_and_optimizer(tmp_path):
    path = str(tmp_path / "checkpoints")
    paddle.seed(3)
    model = paddle.nn.Linear(3, 2)
    optimizer = paddle.optimizer.Adam(learning_rate=0.1, parameters=model.parameters())
    fresh = paddle.nn.Linear(3, 2)
    fresh_optimizer = paddle.optimizer.Adam(learning_rate=0.1, parameters=fresh.parameters())
    assert load_paddle_checkpoint(path, fresh, fresh_optimizer) is None
    for _ in range(3):
        model(paddle.randn([4, 3])).sum().backward()
        optimizer.step()
        optimizer.clear_grad()
    save_paddle_checkpoint(path, model, optimizer, TrainStatus(4))

    assert load_paddle_checkpoint(path, fresh, fresh_optimizer) == TrainStatus(4)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[name].numpy(), value.numpy())
    # The optimizer's keys carry global parameter names: the fresh layers (built
    # second in this process) have other ones, and the state follows them.
    assert model.weight.name != fresh.weight.name
    renamed = {old.name: new.name
               for old, new in zip(model.parameters(), fresh.parameters(), strict=True)}
    saved = optimizer.state_dict()
    restored = fresh_optimizer.state_dict()
    assert len(saved) == len(restored) > 2  # moments, beta powers
    for key, value in saved.items():
        owner = next(old for old in renamed if key.startswith(old + "_"))
        twin = renamed[owner] + key[len(owner):]
        np.testing.assert_array_equal(restored[twin].numpy(), value.numpy())
    # The next step of the restored pair is the next step of the original.
    x = paddle.randn([4, 3])
    for m, o in ((model, optimizer), (fresh, fresh_optimizer)):
        m(x).sum().backward()
        o.step()
    np.testing.assert_allclose(fresh.weight.numpy(), model.weight.numpy(), rtol=1e-6)


def test_master_dataset_trains_a_linear_regression_epoch_by_epoch(tmp_path, start_master):
    total = write_linear_data(tmp_path / "data", files=4, rows=250)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--epochs", "3",
                                "--chunk-bytes", "4000"))
    assert status(proc).num_tasks >= 8
    paddle.seed(1)
    model = paddle.nn.Linear(3, 1)
    optimizer = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    dataset = MasterDataset(parse=parse_row, client_factory=factory_for(proc), trainer_id="solo")
    loader = paddle.io.DataLoader(dataset, batch_size=32, num_workers=0)
    losses, epochs, counts = [], [], []
    with dataset:
        for _ in range(10):  # more loops than epochs: the job's end must end it
            sse, n = 0.0, 0
            for x, y in loader:
                loss = paddle.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.clear_grad()
                sse += float(loss) * x.shape[0]
                n += x.shape[0]
            if n:
                losses.append(sse / n)
                epochs.append(dataset.epoch)
                counts.append(n)
            if dataset.job_done:
                break
        assert trainer_ids(proc) == ["solo"]
    assert trainer_ids(proc) == []  # close() left the master
    assert epochs == [0, 1, 2]
    assert counts == [total] * 3
    assert losses[-1] < losses[0] / 2, losses
    assert status(proc).phase == "Succeeded"
    # Iterating a finished job yields nothing, without a new session.
    assert [batch for batch in loader] == []
    assert trainer_ids(proc) == []


def test_loader_workers_read_through_sessions_of_their_own(tmp_path, start_master):
    total = write_linear_data(tmp_path / "data", files=6, rows=200)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--epochs", "2",
                                "--chunk-bytes", "2000"))
    dataset = MasterDataset(parse=parse_row_with_origin, client_factory=factory_for(proc),
                            trainer_id="7")
    loader = paddle.io.DataLoader(dataset, batch_size=16, num_workers=2)
    reads: dict[int, Counter] = {}
    workers: Counter = Counter()
    try:
        for _ in range(5):
            rows = Counter()
            for ids, origin, _x, _y in loader:
                rows.update(ids.numpy().tolist())
                workers.update(origin.numpy().tolist())
            if rows:
                reads[dataset.epoch] = rows
            if dataset.job_done:
                break
    finally:
        dataset.close()
    # The sessions that registered, from the master's log: no gRPC call races the loader's
    # forks here (a fork while another thread is inside gRPC can crash the child).
    seen = set(re.findall(r"trainer (\S+) registered", proc.log()))
    # Every record exactly once per epoch, through the workers' own sessions.
    assert sorted(reads) == [0, 1]
    for rows in reads.values():
        assert len(rows) == total and set(rows.values()) == {1}
    assert set(workers) == {0, 1}
    assert {"7/0", "7/1"} <= seen and "7" not in seen  # the parent never registered
    assert trainer_ids(proc) == []  # workers left when their epochs ended
    assert status(proc).phase == "Succeeded"


def test_loader_workers_fork_from_a_parent_whose_client_is_open(tmp_path, start_master):
    """The parent holds an open client (registered, its keep-alive running: a save-model
    grant asked, an epoch read with num_workers=0) when the DataLoader forks its workers;
    each worker opens a client of its own and reads. (The trainer's client on grpc.aio
    left such a worker waiting for ever on its first call: grpc.aio does not survive a
    fork. The loader's timeout turns a hang into a failure here.)"""
    total = write_linear_data(tmp_path / "data", files=4, rows=100)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--epochs", "1",
                                "--chunk-bytes", "2000"))
    parent = factory_for(proc)(trainer_id="parent")
    try:
        assert parent.request_save_model(block=1.0)  # a call, and a session kept alive
        dataset = MasterDataset(parse=parse_row_with_origin, client_factory=factory_for(proc),
                                trainer_id="7")
        loader = paddle.io.DataLoader(dataset, batch_size=16, num_workers=2, timeout=120)
        rows: Counter = Counter()
        workers: Counter = Counter()
        try:
            for ids, origin, _x, _y in loader:
                rows.update(ids.numpy().tolist())
                workers.update(origin.numpy().tolist())
        finally:
            dataset.close()
        assert parent.session.active  # the parent's client still works after the forks
        assert parent.connection.get_status().counts.done == parent.connection.get_status().num_tasks
    finally:
        parent.close()
    assert len(rows) == total and set(rows.values()) == {1}
    assert set(workers) == {0, 1}


def test_the_package_exports_the_paddle_integration():
    import trainer_agent
    import trainer_agent.paddle
    from trainer_agent import MasterDataset as exported

    assert exported is trainer_agent.paddle.MasterDataset
    assert trainer_agent.join_batches is trainer_agent.paddle.join_batches


# ---- under the launcher: Paddle's noise stays out of the trainer's log ------------------

NOISY_TRAINER = """
import os, signal, sys
import paddle
import trainer_agent.paddle  # noqa: F401
from paddle.base import core
store = core.TCPStore("127.0.0.1", int(sys.argv[1]), True, 1)  # logs "create libuv server" (INFO)
print("trainer ready", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
"""
QUIET_KNOBS = ("GLOG_minloglevel", "PYTHONWARNINGS", "PADDLECLOUD_PADDLE_SIGNAL_HANDLER")


def launched_noisy_trainer(master: str, **env: str) -> tuple[int, str]:
    base = {k: v for k, v in os.environ.items() if k not in QUIET_KNOBS}
    result = subprocess.run(
        [sys.executable, "-m", "paddlecloud", "trainer", "--", sys.executable, "-c", NOISY_TRAINER,
         str(free_port())],
        env=dict(base, PADDLE_MASTER_ENDPOINT=master, PADDLE_TRAINER_ID="1", **env),
        capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout + result.stderr


def test_launched_trainer_keeps_paddle_s_noise_out_and_a_signal_is_one_line(tmp_path, start_master):
    write_linear_data(tmp_path / "data", files=1, rows=1)
    proc = serving(start_master("--input", str(tmp_path / "data")))
    code, output = launched_noisy_trainer(proc.address)
    assert code == 128 + 15 and "trainer ready" in output, output
    for noise in ("C++ Traceback", "Termination signal", "create libuv server", "No ccache found"):
        assert noise not in output, output
    signalled = [line for line in output.splitlines() if "SIGTERM" in line]
    assert len(signalled) == 1 and signalled[0].endswith("trainer 1 killed by SIGTERM"), output
    # Asked for, it is all there.
    code, output = launched_noisy_trainer(proc.address, GLOG_minloglevel="0", PYTHONWARNINGS="default",
                                          PADDLECLOUD_PADDLE_SIGNAL_HANDLER="1")
    assert code == 128 + 15, output
    for noise in ("C++ Traceback", "Termination signal", "create libuv server", "No ccache found"):
        assert noise in output, output


# ---- the example: python -m examples.fit_a_line.train --------------------------------


def generate_example_data(directory: Path, *, shards: int, rows: int) -> None:
    subprocess.run([sys.executable, "-m", "examples.fit_a_line.data", str(directory),
                    "--shards", str(shards), "--rows", str(rows)],
                   cwd=REPO, check=True, capture_output=True, timeout=60)


class ExampleTrainer:
    """One `python -m examples.fit_a_line.train` process with the env a launcher sets."""

    def __init__(self, tmp: Path, *, rank: int, endpoints: list[str], master: str, output: Path,
                 args: tuple[str, ...] = (), tag: str = "") -> None:
        self.log = tmp / f"example-trainer-{rank}{tag}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO),
                   PADDLE_TRAINER_ID=str(rank), PADDLE_TRAINERS_NUM=str(len(endpoints)),
                   PADDLE_MASTER_ENDPOINT=master, PADDLECLOUD_OUTPUT=str(output),
                   PADDLECLOUD_MASTER_DEADLINE="60")
        if len(endpoints) > 1:
            env.update(PADDLE_TRAINER_ENDPOINTS=",".join(endpoints),
                       PADDLE_CURRENT_ENDPOINT=endpoints[rank])
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "examples.fit_a_line.train", "--batch-size", "32",
                 "--lr", "0.01", *args], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 150) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"trainer still running after {timeout}s:\n{self.output()}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def epochs(self) -> list[tuple[int, float, int, int]]:
        """(epoch, loss, examples in the epoch, examples this trainer read) per epoch line."""
        return [(int(e), float(loss), int(n), int(mine))
                for e, loss, n, _, mine in EPOCH_LINE.findall(self.output())]

    def final_weights(self) -> str | None:
        found = re.search(r"^trainer \S+: final weights (\w+)$", self.output(), re.M)
        return found.group(1) if found else None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@pytest.fixture
def example_trainers(tmp_path):
    started: list[ExampleTrainer] = []

    def start(**kwargs) -> ExampleTrainer:
        trainer = ExampleTrainer(tmp_path, **kwargs)
        started.append(trainer)
        return trainer

    yield start
    for trainer in started:
        trainer.stop()


def test_example_trains_with_two_collective_trainers(tmp_path, start_master, example_trainers):
    generate_example_data(tmp_path / "data", shards=4, rows=500)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--epochs", "3",
                                "--chunk-bytes", "8KiB"))
    output = tmp_path / "output"
    endpoints = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    started = time.monotonic()
    trainers = [example_trainers(rank=r, endpoints=endpoints, master=proc.address, output=output)
                for r in range(2)]
    for t in trainers:
        assert t.wait() == 0, t.output()
    elapsed = time.monotonic() - started
    lines = [t.epochs() for t in trainers]
    assert [e for e, *_ in lines[0]] == [0, 1, 2], trainers[0].output()
    # One model: both trainers print the same global loss, and it falls.
    assert [loss for _, loss, *_ in lines[0]] == [loss for _, loss, *_ in lines[1]]
    losses = [loss for _, loss, *_ in lines[0]]
    assert losses[-1] < losses[0] / 2, losses
    for epoch in range(3):
        assert lines[0][epoch][2] == 2000  # every example once per epoch ...
        assert lines[0][epoch][3] + lines[1][epoch][3] == 2000  # ... split between the two
    assert all(sum(mine for *_, mine in trainer_lines) > 0 for trainer_lines in lines)
    # A checkpoint per epoch (the default keeps 3) and the final model.
    checkpoints = output / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("checkpoint-*")) == [
        f"checkpoint-{e:08d}" for e in range(3)]
    assert latest_train_status(str(checkpoints)) == TrainStatus(2)
    state = paddle.load(str(output / "model" / "model.pdparams"))
    assert sorted(state) == ["bias", "weight"] and list(state["weight"].shape) == [13, 1]
    digests = {t.final_weights() for t in trainers}
    assert len(digests) == 1 and None not in digests
    assert status(proc).phase == "Succeeded"
    print(f"two collective trainers, 3 epochs: {elapsed:.1f}s")


def test_example_trainer_without_data_joins_the_steps_of_the_other(tmp_path, start_master,
                                                                   example_trainers):
    # One task per epoch: one trainer reads all of it, the other none, and both must
    # get through every epoch, stepping together, with one model.
    generate_example_data(tmp_path / "data", shards=1, rows=600)
    proc = serving(start_master("--input", str(tmp_path / "data"), "--epochs", "2"))
    assert status(proc).num_tasks == 1
    endpoints = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    trainers = [example_trainers(rank=r, endpoints=endpoints, master=proc.address,
                                 output=tmp_path / "output") for r in range(2)]
    for t in trainers:
        assert t.wait() == 0, t.output()
    lines = [t.epochs() for t in trainers]
    for epoch in range(2):
        mine = sorted(lines[r][epoch][3] for r in range(2))
        assert mine == [0, 600], lines
    losses = [loss for _, loss, *_ in lines[0]]
    assert losses[1] < losses[0], losses
    digests = {t.final_weights() for t in trainers}
    assert len(digests) == 1 and None not in digests
    assert status(proc).phase == "Succeeded"


def test_example_resumes_from_the_checkpoint_of_its_output(tmp_path, start_master, job_name,
                                                           example_trainers):
    generate_example_data(tmp_path / "data", shards=2, rows=1000)
    data = str(tmp_path / "data")
    output = tmp_path / "output"
    one = [f"127.0.0.1:{free_port()}"]  # PADDLE_TRAINERS_NUM=1: no process group at all
    first_master = serving(start_master("--input", data, "--epochs", "2", "--chunk-bytes", "16KiB"))
    first = example_trainers(rank=0, endpoints=one, master=first_master.address, output=output)
    assert first.wait() == 0, first.output()
    before = first.epochs()
    assert [e for e, *_ in before] == [0, 1]
    resume = latest_train_status(str(output / "checkpoints"))
    assert resume == TrainStatus(1)

    # The launcher starts the next job on this output at TrainStatus.next().
    second_master = serving(start_master("--input", data, "--epochs", "4", "--chunk-bytes", "16KiB",
                                         "--start-epoch", str(resume.next()),
                                         job=f"{job_name}-again"))
    second = example_trainers(rank=0, endpoints=one, master=second_master.address, output=output,
                              tag="-again")
    assert second.wait() == 0, second.output()
    after = second.epochs()
    assert "resumed from the checkpoint of epoch 1" in second.output()
    assert [e for e, *_ in after] == [2, 3]  # no epoch before the checkpoint trained again
    # The weights were loaded: the first resumed epoch is nowhere near a fresh start.
    assert after[0][1] < before[0][1] / 2, (before, after)
    assert after[0][1] < before[1][1] * 1.5, (before, after)
    assert latest_train_status(str(output / "checkpoints")) == TrainStatus(3)
    assert status(second_master).phase == "Succeeded"
