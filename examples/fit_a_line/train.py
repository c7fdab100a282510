"""fit-a-line: a linear regression trained by collective trainers that read from the master.

    python -m examples.fit_a_line.train [--batch-size 64] [--lr 0.002] [--num-workers 0]

Run by the local backend (``paddlecloud local train --module examples.fit_a_line.train``)
or by hand with the environment of docs/design.md section 8 (see README.md next to this
file). Every trainer takes its data from the master through ``MasterDataset``; with
``PADDLE_TRAINERS_NUM`` > 1 the trainers keep one model with PaddlePaddle's collective
API (``init_parallel_env`` + ``paddle.DataParallel``; gloo on CPU). It prints
``epoch N loss X`` once per epoch (the mean squared error over every example of the
epoch, as trained), checkpoints at each epoch end into ``$PADDLECLOUD_OUTPUT/checkpoints``
and when stopped with SIGTERM (the trainers drain to a checkpoint of exactly what the
model consumed, then exit with 143)
(one trainer, the one the master grants), and also inside epochs with
``$PADDLECLOUD_CHECKPOINT_EVERY`` (``paddlecloud local train --checkpoint-every``: the
trainers drain their tasks, agree on the tasks the model consumed and save them with
it, see ``trainer_agent.paddle``), resumes from the newest checkpoint there, and writes
the final model to ``$PADDLECLOUD_OUTPUT/model/``.

``--consumed-log FILE`` (or ``$FIT_A_LINE_CONSUMED_LOG``) appends one JSON line per
training step a trainer took a batch in, ``{"step", "rank", "epoch", "ids"}`` (``ids``:
``record_id`` of each record of the batch), one ``{"saved": step}`` per checkpoint, one
``{"resumed": step}`` per start from a checkpoint and one ``{"started": step}`` per
start: what the model consumed, to check.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="No ccache found")  # paddle's import-time notice

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from examples.fit_a_line.consumed import ConsumedLog  # noqa: E402
from paddlecloud.checkpoints import checkpoints_dir  # noqa: E402
from trainer_agent import termination  # noqa: E402
from trainer_agent.paddle import (  # noqa: E402
    MasterDataset,
    all_reduce_sum,
    join_batches,
    load_paddle_checkpoint_extra,
    save_paddle_checkpoint,
)

FEATURES = 13
MODEL_FILE = "model.pdparams"
logger = logging.getLogger(__name__)


def parse_line(line: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x_1,...,x_13,y`` -> (features, label, record id); a malformed line fails its task."""
    values = np.array(line.split(","), dtype=np.float32)
    if values.shape != (FEATURES + 1,):
        raise ValueError(f"expected {FEATURES + 1} comma-separated numbers, got {values.size}")
    return values[:FEATURES], values[FEATURES:], np.array(record_id(line), dtype=np.int64)


def record_id(line: str) -> int:
    """A record's id: 62 bits of a hash of its line (the data has no id column)."""
    digest = hashlib.blake2b(line.strip().encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


def init_collective(world: int) -> None:
    """Joins the trainer group (PADDLE_TRAINER_ENDPOINTS etc. come from the launcher)."""
    if world <= 1:
        return  # one trainer: no process group at all
    if not paddle.is_compiled_with_cuda():
        # The CPU wheel's 'auto' backend sets up a legacy gloo context but no process
        # group, so all_reduce fails ("The global group is not initialized"): ask for
        # gloo by name. Rank 0 serves the group's TCP store on the port of the first
        # PADDLE_TRAINER_ENDPOINTS entry.
        os.environ.setdefault("PADDLE_DISTRI_BACKEND", "gloo")
        paddle.set_device("cpu")
    dist.init_parallel_env()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.fit_a_line.train",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--output", default=os.environ.get("PADDLECLOUD_OUTPUT", "output"),
                        help="checkpoints and the final model go here [$PADDLECLOUD_OUTPUT]")
    parser.add_argument("--seed", type=int, default=0, help="initial weights")
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="seconds each step sleeps (slows the job, to watch resizes and restarts)")
    parser.add_argument("--consumed-log", default=os.environ.get("FIT_A_LINE_CONSUMED_LOG"),
                        help="append the records each step consumed here [$FIT_A_LINE_CONSUMED_LOG]")
    parser.add_argument("--log-level", default=os.environ.get("PADDLECLOUD_LOG_LEVEL", "INFO"),
                        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="DEBUG adds when the start's parts ended [$PADDLECLOUD_LOG_LEVEL, else INFO]")
    args = parser.parse_args(argv)
    # force: importing paddle already put a handler of its own on the root logger
    logging.basicConfig(level=args.log_level, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The start's parts (bench/recovery.py times a restart with them).
    logger.debug("imports done")

    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    rank = os.environ.get("PADDLE_TRAINER_ID", "0")
    init_collective(world)
    logger.debug("joined the group of %d trainers", world)

    paddle.seed(args.seed)
    model = paddle.nn.Linear(FEATURES, 1)
    optimizer = paddle.optimizer.Momentum(learning_rate=args.lr, momentum=args.momentum,
                                          parameters=model.parameters())
    checkpoints = checkpoints_dir(args.output)
    log = ConsumedLog(args.consumed_log, rank)
    # Every trainer loads the same checkpoint; the master was started at its
    # TrainStatus.next() by the launcher (--start-epoch, or RestartEpoch with the tasks
    # a checkpoint inside an epoch consumed, when a collective group restarts), so no
    # record the model consumed is fed again.
    resumed = load_paddle_checkpoint_extra(checkpoints, model, optimizer)
    step_count = 0
    status = None
    if resumed is not None:
        status, extra = resumed
        step_count = int(extra.get("step", 0))
        where = f"inside epoch {status.epoch}" if status.in_epoch else f"of epoch {status.epoch}"
        print(f"trainer {rank}: resumed from the checkpoint {where} (step {step_count})", flush=True)
        log.write(resumed=step_count, rank=log.rank)
    log.write(started=step_count, rank=log.rank)
    # DataParallel broadcasts rank 0's parameters, then averages gradients in backward().
    net = paddle.DataParallel(model) if world > 1 else model

    # SIGTERM (a preemption, a suspend, a scale-down) drains the group to a checkpoint of
    # exactly what the model consumed, then the trainers exit (see below).
    dataset = MasterDataset(parse=parse_line, drain_on_stop=args.num_workers == 0)
    dataset.resume(status)
    loader = paddle.io.DataLoader(dataset, batch_size=args.batch_size,
                                  num_workers=args.num_workers)
    idle_x = paddle.zeros([1, FEATURES], dtype="float32")
    idle_y = paddle.zeros([1, 1], dtype="float32")
    sse, examples = 0.0, 0  # of the epoch so far (in this process)
    try:
        while True:
            # One segment: the epoch, or its part up to a checkpoint inside it. The
            # master shards dynamically, so trainers get unequal numbers of batches,
            # and one whose share is read waits for the epoch's last tasks held by
            # others. join_batches keeps every trainer in the same collective steps:
            # each step the trainers all_reduce (examples held, still has data); a
            # trainer without a batch runs the step on a dummy input with a zero loss
            # scale, so its gradients are zero but it still takes part in
            # DataParallel's gradient all_reduce, until every trainer is out (as
            # PyTorch DDP's Join does). The loss is scaled so that the averaged
            # gradient is the mean over every example of the step, however the
            # examples were spread over the trainers.
            for step in join_batches(loader):
                x, y = step.batch[:2] if step.batch is not None else (idle_x, idle_y)
                error = net(x) - y
                loss_sum = (error * error).sum()
                (loss_sum * step.loss_scale).backward()
                optimizer.step()
                optimizer.clear_grad()
                if args.step_delay:
                    time.sleep(args.step_delay)
                step_count += 1
                if step.batch is not None:
                    sse += float(loss_sum)
                    examples += step.size
                    log.write(step=step_count, rank=log.rank, epoch=dataset.epoch,
                              ids=[int(i) for i in step.batch[2].numpy().reshape(-1)])
            # Every trainer is out: every record read went into a step. Agree on where.
            boundary = dataset.boundary()
            if boundary.epoch_over:
                mine = examples
                total_sse, total = all_reduce_sum([sse, examples])
                sse, examples = 0.0, 0
                if total:
                    print(f"epoch {boundary.epoch} loss {total_sse / total:.6f} "
                          f"examples {int(total)} (trainer {rank}: {mine})", flush=True)
            # The master picks one trainer to save (all models are identical).
            if boundary.read and dataset.request_save_model():
                save_paddle_checkpoint(checkpoints, model, optimizer, boundary.train_status,
                                       extra={"step": step_count})
                log.write(saved=step_count, rank=log.rank, epoch=boundary.epoch,
                          tasks_done=None if boundary.epoch_over else len(boundary.tasks_done))
            if boundary.stop:
                print(f"trainer {rank}: stopped at step {step_count} "
                      f"({'the end' if boundary.epoch_over else 'inside'} of epoch {boundary.epoch}); "
                      "the next start resumes there", flush=True)
                return termination.STOPPED_EXIT
            if boundary.job_done:
                break
        if dataset.request_save_model():
            save_final_model(model, os.path.join(args.output, "model"))
        print(f"trainer {rank}: final weights {weights_digest(model)}", flush=True)
    finally:
        dataset.close()
    return 0


def weights_digest(model: paddle.nn.Layer) -> str:
    """A short hash of the parameters: equal on every trainer when they keep one model."""
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(value.numpy()).tobytes())
    return digest.hexdigest()[:16]


def save_final_model(model: paddle.nn.Layer, directory: str) -> str:
    """``paddle.save`` of the state dict, written under a temporary name then renamed."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, MODEL_FILE)
    tmp = f"{path}.tmp-{os.getpid()}"
    paddle.save(model.state_dict(), tmp)
    os.replace(tmp, path)
    print(f"saved the final model to {path}", flush=True)
    return path


if __name__ == "__main__":
    sys.exit(main())
