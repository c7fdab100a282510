"""The cluster autoscaler: moves each elastic job's trainer count within its min..max so the
cluster stays busy and submitters wait less (PaddlePaddle EDL's controller, rebuilt).

`autoscaler.planner` is the pure planning function: a cluster snapshot in, a size per job and
the reason for each change out. The controller that reads the cluster and applies a plan
through the job's `scale` path is not here yet (it needs elastic jobs).
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
