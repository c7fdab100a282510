"""wide-deep-ps: a real PaddlePaddle fleet parameter-server job (static graph), wide & deep-like.

    python -m examples.wide_deep_ps.data DATA
    paddlecloud local train --module examples.wide_deep_ps.train --package-path . \\
        --python PS_VENV/bin/python --pservers 2 --trainers 2 --input 'DATA/*.txt' \\
        --epochs 4 -e PADDLECLOUD_TASK_FEED=1

One script for both roles, as Paddle's PS programs are: `TRAINING_ROLE=PSERVER` serves the
parameters (`fleet.run_server()`, which never returns: paddlecloud stops the pservers at the
job's end), `TRAINING_ROLE=TRAINER` trains. The roles come from the environment Paddle's
`PaddleCloudRoleMaker` reads (what paddle-operator sets and paddlecloud's launchers set too).

The model: a sparse embedding of the record's id, held by the pservers (the wide part), and a
small dense tower over 13 features plus that embedding (the deep part). Async mode by default,
geo with `PS_MODE=geo` (`k_steps` 20).

Data comes from the master, task by task, through the task feed (`paddlecloud.taskfeed`: this
program runs on Paddle 2.6.2, whose protobuf cannot load paddlecloud's gRPC code): each task is a
file of MultiSlot lines, trained with `exe.train_from_dataset` (which also pulls the dense
parameters back from the pservers: a plain `exe.run` loop would not). After every epoch the
trainer prints `epoch N eval_loss X` on a fixed evaluation set. With `$PADDLECLOUD_RECORD_LOG`
it appends `epoch<TAB>task<TAB>trainer<TAB>begin|end<TAB>records<TAB>unix time` around each task's
training:
the record lineage of what the model saw (a task begun and never ended was cut by a fault).

Needs PaddlePaddle with the parameter-server core: 2.6.2 (`numpy<2`, `protobuf>=4.21,<5`);
paddlecloud refuses a PS job on Paddle >= 3.1.1 before it starts.
"""

from __future__ import annotations

import os
import sys
import time

VOCAB, FEATURES, BATCH = 100, 13, 32


def build(paddle, fleet, mode: str):
    """The model, the loss and the distributed optimizer; returns (inputs, loss)."""
    ids = paddle.static.data("ids", [None, 1], "int64")
    x = paddle.static.data("x", [None, FEATURES], "float32")
    y = paddle.static.data("y", [None, 1], "float32")
    if mode == "geo":  # geo-SGD needs a plain sparse-gradient embedding
        emb = paddle.static.nn.embedding(ids, size=[VOCAB, 4], is_sparse=True,
                                         param_attr=paddle.ParamAttr(name="wide_emb"))
    else:
        emb = paddle.static.nn.sparse_embedding(ids, size=[VOCAB, 4],
                                                param_attr=paddle.ParamAttr(name="wide_emb"))
    deep = paddle.concat([x, paddle.reshape(emb, [-1, 4])], axis=1)
    hidden = paddle.static.nn.fc(deep, 16, activation="relu")
    pred = paddle.static.nn.fc(hidden, 1)
    loss = paddle.mean(paddle.nn.functional.square_error_cost(pred, y))
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    if mode == "geo":
        strategy.a_sync_configs = {"k_steps": 20}
    optimizer = paddle.optimizer.SGD(learning_rate=float(os.environ.get("PS_LR", "0.002")))
    fleet.distributed_optimizer(optimizer, strategy).minimize(loss)
    return (ids, x, y), loss


def eval_batch(inputs_count: int = 512):
    """A fixed evaluation set drawn from the data's own model (examples/wide_deep_ps/data.py)."""
    import random

    import numpy as np

    from examples.wide_deep_ps.data import true_model

    weights, offsets = true_model(0)
    rng = random.Random("eval")
    xs = [[rng.gauss(0, 1) for _ in range(FEATURES)] for _ in range(inputs_count)]
    ids = [rng.randrange(VOCAB) for _ in range(inputs_count)]
    ys = [sum(a * b for a, b in zip(weights, row, strict=True)) + offsets[i]
          for row, i in zip(xs, ids, strict=True)]
    return {"ids": np.array(ids, dtype="int64").reshape(-1, 1), "x": np.array(xs, dtype="float32"),
            "y": np.array(ys, dtype="float32").reshape(-1, 1)}


def note(path: str | None, line: str) -> None:
    """One line of the record lineage ($PADDLECLOUD_RECORD_LOG): a task's training began or
    ended on this trainer (one write per line, so a trainer killed mid-way leaves whole lines)."""
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def train(paddle, fleet, inputs, loss) -> int:
    import numpy as np

    from paddlecloud.fleet_ps import gloo_trainers, init_worker, restore, save_checkpoint
    from paddlecloud.taskfeed import TaskFeed

    trainer = os.environ.get("PADDLE_TRAINER_ID", "?")
    if os.environ.get("PADDLECLOUD_OUTPUT"):  # train_from_dataset writes <id>_train_desc.prototxt here
        os.chdir(os.environ["PADDLECLOUD_OUTPUT"])  # (an absolute path: restore and save use it too)
    main = paddle.static.default_main_program()
    test = main.clone(for_test=True)
    test = test._prune(targets=[test.global_block().var(loss.name)])  # forward only: no push
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    if init_worker(fleet):  # not fleet.init_worker(): a restarted trainer 0 would reset the model
        print(f"trainer {trainer}: the pservers hold a model: pulled it, pushed nothing", flush=True)
    output = os.environ.get("PADDLECLOUD_OUTPUT", "")
    # trainer 0 saves and loads the pservers' tables; under gloo Paddle makes those collectives
    checkpoints = bool(output) and (trainer == "0" or gloo_trainers())
    restored = restore(fleet, output=output) if checkpoints else None
    if restored is not None and trainer == "0":
        print(f"trainer 0: loaded the checkpoint of epoch {restored} into the pservers", flush=True)
    feed_eval = eval_batch()

    def evaluate() -> float:  # a fresh Executor each time: a cached one crashes after train_from_dataset (2.6.2)
        out = paddle.static.Executor(paddle.CPUPlace()).run(test, feed=feed_eval, fetch_list=[loss.name])
        return float(np.array(out[0]).mean())

    print(f"trainer {trainer}: start eval_loss {evaluate():.4f}", flush=True)
    dataset = paddle.distributed.QueueDataset()
    dataset.init(batch_size=BATCH, use_var=list(inputs), pipe_command="cat", thread_num=1)
    records = 0
    lineage = os.environ.get("PADDLECLOUD_RECORD_LOG")
    with TaskFeed.from_env() as feed:
        for epoch in feed.epochs():
            for task in epoch:
                with open(task.path) as f:
                    count = sum(1 for _ in f)
                note(lineage, f"{epoch.number}\t{task.task_id}\t{trainer}\tbegin\t{count}\t{time.time():.3f}")
                dataset.set_filelist([task.path])
                exe.train_from_dataset(program=main, dataset=dataset, print_period=10**9, debug=False)
                note(lineage, f"{epoch.number}\t{task.task_id}\t{trainer}\tend\t{count}\t{time.time():.3f}")
                records += count
            print(f"trainer {trainer}: epoch {epoch.number} eval_loss {evaluate():.4f} "
                  f"tasks {epoch.tasks_read} records {records}", flush=True)
            if checkpoints:  # the epoch is done at the master: checkpoint the tables
                save_checkpoint(fleet, exe, output=output, epoch=epoch.number)
    fleet.stop_worker()
    print(f"trainer {trainer}: done", flush=True)
    return 0


def main() -> int:
    import paddle
    import paddle.distributed.fleet as fleet

    paddle.enable_static()
    fleet.init(fleet.PaddleCloudRoleMaker(is_collective=False))
    inputs, loss = build(paddle, fleet, os.environ.get("PS_MODE", "async"))
    if fleet.is_server():
        fleet.init_server()
        print(f"pserver {os.environ.get('PADDLE_PORT')}: serving", flush=True)
        fleet.run_server()  # blocks: paddlecloud stops the pserver at the job's end
        return 0
    started = time.time()
    code = train(paddle, fleet, inputs, loss)
    print(f"trained in {time.time() - started:.1f}s", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
