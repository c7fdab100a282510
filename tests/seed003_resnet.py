"""Seed 003's Example 2 image (`demo-resnet`): its Dockerfile's shape and command, on a base with
a real Paddle (CPU) instead of paddle-base-gpu, and a `train_fleet.py` that trains for real. Its
command is Paddle's own launcher: `python -m paddle.distributed.launch train_fleet.py`.
"""

from __future__ import annotations

from tests import containers

IMAGE = "registry.baidubce.com/paddle-operator/demo-resnet:v1"
# The same image on Paddle 2.6.2, for a job whose command is Paddle 2.x's launcher
IMAGE_PADDLE2 = "registry.baidubce.com/paddle-operator/demo-resnet:paddle-2.6.2"

# train_fleet.py: real collective training (Paddle's fleet, gloo on CPU instead of NCCL on a
# GPU): a small regression on synthetic data, each rank its own shard, the loss averaged over
# the ranks at every step; its report goes to $PADDLECLOUD_OUTPUT, else out/ in its WORKDIR.
TRAIN_FLEET = r'''
import json, os
import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet

fleet.init(is_collective=True)
rank, world = dist.get_rank(), dist.get_world_size()
paddle.seed(7)
true_w = np.random.RandomState(0).normal(size=(8, 1)).astype("float32")
model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.Tanh(), paddle.nn.Linear(16, 1))
model = fleet.distributed_model(model)
opt = fleet.distributed_optimizer(paddle.optimizer.Adam(learning_rate=0.05, parameters=model.parameters()))
data = np.random.RandomState(100 + rank)
losses = []
for step in range(40):
    x = data.normal(size=(32, 8)).astype("float32")
    loss = paddle.nn.functional.mse_loss(model(paddle.to_tensor(x)), paddle.to_tensor(x @ true_w))
    loss.backward()
    opt.step()
    opt.clear_grad()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    losses.append(float(mean) / world)
out = os.environ.get("PADDLECLOUD_OUTPUT", "out")
os.makedirs(out, exist_ok=True)
report = {"rank": rank, "world": world, "trainer_id": os.environ["PADDLE_TRAINER_ID"],
          "uid": os.getuid(), "cwd": os.getcwd(), "losses": losses, "paddle": paddle.__version__,
          "digest": sum(float(p.sum()) for p in model.parameters())}
open(f"{out}/trainer.{rank}.json", "w").write(json.dumps(report))
print(json.dumps(report), flush=True)
'''

# Example 2's Dockerfile, on a base with Paddle (CPU) instead of paddle-base-gpu
CONTAINERFILE = """\
FROM {base}
RUN ln -s /usr/bin/python3 /usr/local/bin/python
ADD resnet /resnet
WORKDIR /resnet
CMD ["python","-m","paddle.distributed.launch","train_fleet.py"]
"""


def build(tag: str, base: str) -> str:
    return containers.build_image(tag, containerfile=CONTAINERFILE.format(base=base),
                                  files={"resnet/train_fleet.py": TRAIN_FLEET})


def assert_trained_as_one_job(found: list[dict], *, paddle: str) -> None:
    """Two ranks of one job, each its trainer id, that trained one model: the same averaged
    losses and weights on both, and the loss fell."""
    assert sorted((r["rank"], r["world"], r["trainer_id"]) for r in found) == [(0, 2, "0"), (1, 2, "1")]
    for report in found:  # the image's user in its WORKDIR, the image's Paddle
        assert (report["uid"], report["cwd"], report["paddle"]) == (0, "/resnet", paddle)
    assert found[0]["losses"] == found[1]["losses"] and found[0]["digest"] == found[1]["digest"]
    losses = found[0]["losses"]
    assert sum(losses[-5:]) / 5 < losses[0] / 4, losses
