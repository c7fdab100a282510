"""The cluster autoscaler: moves each elastic job's trainer count within its min..max so the
cluster stays busy and submitters wait less (PaddlePaddle EDL's controller, rebuilt).

`autoscaler.planner` is the pure planning function: a cluster snapshot in, a size per job and
the reason for each change out. `autoscaler.snapshot` builds that snapshot from the Kubernetes
API's objects, `autoscaler.controller` reads the cluster and applies each plan through the
job's own scale path (its master's ScaleTrainers), `autoscaler.lease` elects one leader among
the replicas, and `autoscaler.cli` is `paddlecloud autoscaler`. docs/autoscaler.md says how.
"""

from autoscaler.planner import (
    DEFAULT_MAX_LOAD_DESIRED,
    Change,
    Cluster,
    Job,
    Node,
    Plan,
    plan,
)

__all__ = ["DEFAULT_MAX_LOAD_DESIRED", "Change", "Cluster", "Job", "Node", "Plan", "plan"]
