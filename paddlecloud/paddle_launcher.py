"""What Paddle's own launcher (`python -m paddle.distributed.launch`) reads in a collective
trainer, per Paddle version, so that a user's command of it rendezvouses as written; both
backends give it to every collective trainer (docs/kubernetes.md, "Paddle's launcher").

- Paddle >= 2.3 (`paddle/distributed/launch`): its master is the first entry of
  `PADDLE_TRAINER_ENDPOINTS` (or `PADDLE_MASTER`), its node count their distinct hosts (or
  `PADDLE_NNODES`), its node's address `POD_IP`; the node whose `POD_IP` is the master's host
  serves the rendezvous on its port. `PADDLE_RANK` keeps each node's rank its trainer id
  (else the launcher ranks the nodes by a random name, and hands its processes that rank as
  their `PADDLE_TRAINER_ID`).
- Paddle 2.0-2.2 (`paddle/distributed/fleet/launch.py`, `--legacy=true` from 2.3): a job of
  all nodes only with `PADDLE_TRAINERS` (the hosts, `POD_IP` among them),
  `TRAINER_PORTS_NUM`, `PADDLE_TRAINER_ID` and `PADDLE_TRAINERS_NUM` > 1; its endpoints are
  `HOST:PADDLE_PORT`, or `DISTRIBUTED_TRAINER_ENDPOINTS` where given. Without them each node
  is a job of one trainer.

So every trainer's `POD_IP` must be its own host in the endpoints, and the hosts distinct.
"""

from __future__ import annotations

from collections.abc import Sequence

# Set by paddlecloud, so a user's env may not set them (jobspec.sections.RESERVED_ENV).
LAUNCHER_ENV = frozenset({"PADDLE_MASTER", "PADDLE_NNODES", "PADDLE_RANK", "PADDLE_TRAINERS",
                          "TRAINER_PORTS_NUM"})


def host_of(endpoint: str) -> str:
    return endpoint.rsplit(":", 1)[0]


def launcher_env(endpoints: Sequence[str], rank: str) -> dict[str, str]:
    """The launcher's variables for the trainer of rank `rank` (a trainer id, or a Kubernetes
    `$(PADDLE_TRAINER_ID)`) among `endpoints` (one per trainer, in rank order)."""
    return {
        "PADDLE_MASTER": endpoints[0],
        "PADDLE_NNODES": str(len(endpoints)),
        "PADDLE_RANK": rank,
        "PADDLE_TRAINERS": ",".join(host_of(e) for e in endpoints),
        "TRAINER_PORTS_NUM": "1",  # one endpoint per trainer
    }
