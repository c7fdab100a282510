"""EDL's `TrainingJob` (`paddlepaddle.org/v1`), converted into the PaddleJob that runs it.

EDL's users bring a TrainingJob YAML (seed 004: `kubectl create -f examplejob.yaml`). It
is not a second job model: `to_paddlejob` converts it into a paddle-operator PaddleJob
document, which the one translation (`paddlecloud.paddlejob.translate`) then reads, so
`paddlecloud job submit -f` and the operator (which creates that PaddleJob, owned by the
TrainingJob: docs/kubernetes.md) run a TrainingJob exactly as they run its PaddleJob.

Field by field, as EDL's controller gave them meaning:

* `image`: the image of every trainer and pserver container;
* `trainer.entrypoint`: a shell command line, run as written by the image's `sh -c` (EDL's
  `paddle_k8s` ran `sh -c "$ENTRY"`), in `trainer.workspace` (the container's
  workingDir), with the image's entrypoint replaced and nothing of paddlecloud around it
  (as every PaddleJob container runs); the pservers run the same command with `TRAINING_ROLE=PSERVER`, as Fluid's
  PS scripts switch on it;
* `trainer.min-instance`/`max-instance`: the elastic trainer range the autoscaler and `job
  scale` act on; the job starts at min-instance, as EDL's did;
* `pserver.min-instance`: the pservers, a fixed count (paddlecloud's pservers keep their
  slots); a `max-instance` that differs is accepted with a warning;
* `trainer.passes`: the job's epochs, and `PADDLE_INIT_NUM_PASSES` for the program (EDL's
  name for it);
* `port`, `ports_num`, `ports_num_for_sparse`: `PADDLE_INIT_PORT`, `PADDLE_INIT_PORTS_NUM`,
  `PADDLE_INIT_PORTS_NUM_FOR_SPARSE` for the program (EDL's names); paddlecloud's pservers
  listen on `PADDLE_PORT`, given as every job's;
* `fault_tolerant`: true is what every paddlecloud job is (the master re-queues a dead
  trainer's tasks, failed pods are replaced); false is accepted with a warning;
* `resources` of each role: the containers' `resources`, as given.

An unknown field is refused naming it and the nearest known one, as for a PaddleJob.

What this does NOT do: EDL's cluster-wide autoscaler policy (paddlecloud's autoscaler acts
on the range), nor Paddle v1's `paddle pserver` binary (the pserver is the user's program).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from paddlecloud.jobspec import PADDLEJOB_API_VERSION, PADDLEJOB_KIND, JobSpecError
from paddlecloud.paddlejob import METADATA_FIELDS, _integer, _mapping, _string, refuse_unknown

logger = logging.getLogger(__name__)

TRAININGJOB_API_VERSION = "paddlepaddle.org/v1"
TRAININGJOB_KIND = "TrainingJob"
SPEC_FIELDS = ("image", "port", "ports_num", "ports_num_for_sparse", "fault_tolerant", "trainer",
               "pserver")
TRAINER_FIELDS = ("entrypoint", "workspace", "passes", "min-instance", "max-instance", "resources")
PSERVER_FIELDS = ("min-instance", "max-instance", "resources")
RESOURCE_FIELDS = ("limits", "requests")
PASSES_ENV = "PADDLE_INIT_NUM_PASSES"
PORT_ENVS = {"port": "PADDLE_INIT_PORT", "ports_num": "PADDLE_INIT_PORTS_NUM",
             "ports_num_for_sparse": "PADDLE_INIT_PORTS_NUM_FOR_SPARSE"}


def is_trainingjob(doc: Mapping[str, Any]) -> bool:
    return doc.get("kind") == TRAININGJOB_KIND


def to_paddlejob(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The PaddleJob document that runs TrainingJob `doc`; JobSpecError names a bad field."""
    if doc.get("apiVersion") != TRAININGJOB_API_VERSION:
        raise JobSpecError(f"TrainingJob apiVersion {doc.get('apiVersion')!r} is not supported: "
                           f"use {TRAININGJOB_API_VERSION} (EDL's)")
    refuse_unknown(doc, ("apiVersion", "kind", "metadata", "spec", "status"), where="TrainingJob")
    meta = _mapping(doc.get("metadata"), where="metadata")
    refuse_unknown(meta, METADATA_FIELDS, where="metadata")
    spec = _mapping(doc.get("spec"), where="spec")
    refuse_unknown(spec, SPEC_FIELDS, where="spec")
    image = spec.get("image")
    if not image:
        raise JobSpecError("the TrainingJob has no spec.image: give the image its trainers and "
                           "pservers run")
    _string(image, where="spec.image")
    trainer = _mapping(spec.get("trainer"), where="spec.trainer")
    refuse_unknown(trainer, TRAINER_FIELDS, where="spec.trainer")
    pserver = _mapping(spec.get("pserver"), where="spec.pserver")
    refuse_unknown(pserver, PSERVER_FIELDS, where="spec.pserver")
    name = str(meta.get("name") or "")
    if spec.get("fault_tolerant") is not None and not isinstance(spec["fault_tolerant"], bool):
        raise JobSpecError(f"invalid spec.fault_tolerant {spec['fault_tolerant']!r:.40}: true or false")
    if spec.get("fault_tolerant") is False:
        logger.warning("TrainingJob %s: fault_tolerant false is run fault-tolerant anyway: every "
                       "paddlecloud job re-queues a dead trainer's tasks and replaces failed pods", name)

    low, high = _instances(trainer, where="spec.trainer", minimum=1)
    pservers, pserver_max = _instances(pserver, where="spec.pserver", minimum=0) if pserver else (0, 0)
    if pserver_max != pservers:
        logger.warning("TrainingJob %s: spec.pserver min-instance %d and max-instance %d differ; "
                       "paddlecloud runs %d pservers (each keeps its slot: pservers do not scale)",
                       name, pservers, pserver_max, pservers)
    passes = _integer(trainer.get("passes", 1), where="spec.trainer.passes", minimum=1)
    container = _container(spec, trainer, passes=passes)
    job_spec: dict[str, Any] = {
        "epochs": passes,
        "worker": {"replicas": low, "requests": low, "limits": high,
                   "template": _template("trainer", container, trainer.get("resources"), where="spec.trainer")},
    }
    if pservers:
        job_spec["ps"] = {"replicas": pservers,
                          "template": _template("pserver", container, pserver.get("resources"),
                                                where="spec.pserver")}
    return {"apiVersion": PADDLEJOB_API_VERSION, "kind": PADDLEJOB_KIND,
            # not the annotations: kubectl's and the operator's own bookkeeping is the TrainingJob's
            "metadata": {k: v for k, v in meta.items() if k in ("name", "namespace", "labels")},
            "spec": job_spec}


def _instances(role: Mapping[str, Any], *, where: str, minimum: int) -> tuple[int, int]:
    """(min-instance, max-instance); max defaults to min."""
    if role.get("min-instance") is None:
        raise JobSpecError(f"{where} has no min-instance: give how many to run")
    low = _integer(role["min-instance"], where=f"{where}.min-instance", minimum=minimum)
    high = _integer(role.get("max-instance", low), where=f"{where}.max-instance", minimum=minimum)
    if low > high:
        raise JobSpecError(f"{where}: min-instance {low} is more than max-instance {high}")
    return low, high


def _container(spec: Mapping[str, Any], trainer: Mapping[str, Any], *, passes: int) -> dict[str, Any]:
    """The container both roles run: the entrypoint through the image's sh, in the workspace."""
    entrypoint = _string(trainer.get("entrypoint") or "", where="spec.trainer.entrypoint")
    if not entrypoint.strip():
        raise JobSpecError("the TrainingJob has no spec.trainer.entrypoint: give the command line "
                           "its trainers run (e.g. \"python train.py\")")
    env = [{"name": PASSES_ENV, "value": str(passes)}]
    for field, variable in PORT_ENVS.items():
        if spec.get(field) is not None:
            value = _integer(spec[field], where=f"spec.{field}", minimum=0 if field != "port" else 1)
            env.append({"name": variable, "value": str(value)})
    container: dict[str, Any] = {"image": spec["image"], "command": ["sh", "-c", entrypoint], "env": env}
    if trainer.get("workspace"):
        container["workingDir"] = _string(trainer["workspace"], where="spec.trainer.workspace")
    return container


def _template(role: str, container: Mapping[str, Any], resources: Any, *, where: str) -> dict[str, Any]:
    resources = _mapping(resources, where=f"{where}.resources")
    refuse_unknown(resources, RESOURCE_FIELDS, where=f"{where}.resources")
    one = {"name": role, **container, "env": [dict(e) for e in container["env"]]}
    if resources:
        one["resources"] = {kind: {str(k): str(v) for k, v in _mapping(amounts, where=f"{where}.resources.{kind}").items()}
                            for kind, amounts in resources.items()}
    return {"spec": {"containers": [one]}}
