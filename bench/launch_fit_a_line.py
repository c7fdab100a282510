"""fit-a-line as a plain collective Paddle script, for PaddlePaddle's own elastic launcher.

    python -m paddle.distributed.launch --master etcd://HOST:PORT --job_id J --nnodes 2:3 \\
        bench/launch_fit_a_line.py DATA_DIR OUT_DIR [--epochs 3] [--step-delay 0.02]

The same model, batch size and optimizer as examples/fit_a_line/train.py, but as users of
`paddle.distributed.launch` write it: each rank reads its own shard of the CSV files
(file i goes to rank i mod world size), rank 0 saves a checkpoint at each epoch's end and
every rank resumes from it. It logs what each step consumed in the example's format
(`{"step", "rank", "epoch", "ids"}`, `{"resumed": step}`), so bench/recovery.py audits
both the same way. Run by bench/recovery.py; not a part of paddlecloud.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.fit_a_line.train import FEATURES, parse_line  # noqa: E402

BATCH = 64


def shard(data: Path, rank: int, world: int) -> list[tuple[np.ndarray, np.ndarray, int]]:
    files = sorted(data.glob("*.csv"))[rank::world]
    rows = []
    for path in files:
        for line in path.read_text().splitlines():
            if line.strip():
                x, y, record = parse_line(line)
                rows.append((x, y, int(record)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--step-delay", type=float, default=0.0)
    args = parser.parse_args()
    os.environ.setdefault("PADDLE_DISTRI_BACKEND", "gloo")
    paddle.set_device("cpu")
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    paddle.seed(0)
    model = paddle.nn.Linear(FEATURES, 1)
    optimizer = paddle.optimizer.Momentum(learning_rate=0.002, momentum=0.9,
                                          parameters=model.parameters())
    checkpoint = args.out / "checkpoint.pdparams"
    log = open(args.out / "consumed.jsonl", "a")
    start_epoch, step = 0, 0
    if checkpoint.exists():
        saved = paddle.load(str(checkpoint))
        model.set_state_dict(saved["model"])
        optimizer.set_state_dict(saved["optimizer"])
        start_epoch, step = int(saved["epoch"]) + 1, int(saved["step"])
        log.write(json.dumps({"resumed": step, "rank": rank}) + "\n")
        log.flush()
    net = paddle.DataParallel(model) if world > 1 else model
    rows = shard(args.data, rank, world)
    steps = -(-len(rows) // BATCH)  # the last batch may be partial: every record is read
    for epoch in range(start_epoch, args.epochs):
        sse = 0.0
        for i in range(steps):
            batch = rows[i * BATCH:(i + 1) * BATCH]
            x = paddle.to_tensor(np.stack([r[0] for r in batch]))
            y = paddle.to_tensor(np.stack([r[1] for r in batch]))
            loss = ((net(x) - y) ** 2).mean()
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            step += 1
            sse += float(loss) * len(batch)
            log.write(json.dumps({"step": step, "rank": rank, "epoch": epoch,
                                  "ids": [r[2] for r in batch]}) + "\n")
            log.flush()
            if args.step_delay:
                time.sleep(args.step_delay)
        print(f"epoch {epoch} loss {sse / max(1, len(rows)):.6f} (rank {rank})", flush=True)
        if rank == 0:
            tmp = checkpoint.with_suffix(".tmp")
            paddle.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "epoch": epoch, "step": step}, str(tmp))
            os.replace(tmp, checkpoint)
        dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
