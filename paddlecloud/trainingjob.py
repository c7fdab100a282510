"""EDL's `TrainingJob` (`paddlepaddle.org/v1`), converted into the PaddleJob that runs it.

EDL's users bring a TrainingJob YAML (seed 004: `kubectl create -f examplejob.yaml`). It
is not a second job model: `to_paddlejob` converts it into a paddle-operator PaddleJob
document, which the one translation (`paddlecloud.paddlejob.translate`) then reads, so
`paddlecloud job submit -f` and the operator (which creates that PaddleJob, owned by the
TrainingJob: docs/kubernetes.md) run a TrainingJob exactly as they run its PaddleJob.

Field by field, as EDL's own types (`pkg/apis/paddlepaddle/v1/types.go`) and its controller
(`pkg/updater/jobparser.go`) gave them meaning:

* `image`: the image of every trainer and pserver container;
* `trainer.entrypoint`: a shell command line, run as written by the image's `sh -c` (EDL's
  `paddle_k8s start_new_trainer` ran `$ENTRY` so), in `trainer.workspace` (the container's
  workingDir), with the image's entrypoint replaced and nothing of paddlecloud around it
  (as every PaddleJob container runs); `ENTRY` and `TRAINER_PACKAGE` carry them too, as EDL
  gave them;
* the pservers run what EDL's controller ran for them, the image's own `paddle_k8s
  start_new_pserver` (`fault_tolerant: true`) or `paddle_k8s start_pserver` (EDL's
  PserverSpec names no command: EDL's job images carry that script), with
  `TRAINING_ROLE=PSERVER`; `pserver.entrypoint` (paddlecloud's, not EDL's) is a command line
  of one's own instead, run as the trainer's is (e.g. a Fluid program that switches on
  `TRAINING_ROLE`). paddlecloud's trainers wait for every pserver at its `PADDLE_PORT`;
* `trainer.min-instance`/`max-instance`: the elastic trainer range the autoscaler and `job
  scale` act on; the job starts at min-instance, as EDL's did;
* `pserver.min-instance`: the pservers, a fixed count (paddlecloud's pservers keep their
  slots); a `max-instance` that differs is accepted with a warning;
* `passes` (EDL's types put it in `spec`; its examples in `spec.trainer`: either, not two
  different values): the job's epochs, and `PADDLE_INIT_NUM_PASSES` for the program;
* `port`, `ports_num`, `ports_num_for_sparse`: `PADDLE_INIT_PORT`, `PADDLE_INIT_PORTS_NUM`,
  `PADDLE_INIT_PORTS_NUM_FOR_SPARSE` for the program, with EDL's defaults (7164, 1, 1);
  `TRAINERS`, `PSERVERS` and `PADDLE_INIT_NUM_GRADIENT_SERVERS` as EDL set them (the counts
  at the start);
* `volumes` and `VolumeMounts` (Go's JSON decoding matched EDL's field names in any case, so
  `volumeMounts` too; each `{name, mountPath}`): the pods' volumes and the containers'
  mounts, on trainers and pservers (EDL mounted them on its trainers and master; paddlecloud's
  master reads no user data, and a pserver gets them too rather than volumes it cannot see);
* `NodeSelector` (or `nodeSelector`) and `imagePullSecrets`: the pods', as given;
* `host_network: true`: the pods on the node's network, paddle-operator's `intranet: Host`;
* `fault_tolerant`: true is what every paddlecloud job is (the master re-queues a dead
  trainer's tasks, failed pods are replaced); false is accepted with a warning;
* `resources` of each role: the containers' `resources`, as given;
* `master`: EDL's per-job master (its Go master and an etcd) is paddlecloud's per-job master
  here, which `job submit` and the operator create for every job. `master.resources` is
  accepted with a warning (paddlecloud's master has its own requests; EDL's controller
  ignored this field as well); `etcd-endpoint` (of `master` or `trainer`) and the
  `replicaSpec`s, which EDL's controller generated itself, are refused naming what to write
  instead.

An unknown field is refused naming it and the nearest known one, as for a PaddleJob.

What this does NOT do: EDL's cluster-wide autoscaler policy (paddlecloud's autoscaler acts
on the range), nor provide `paddle_k8s` (the image's, as under EDL).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

from paddlecloud.jobspec import PADDLEJOB_API_VERSION, PADDLEJOB_KIND, JobSpecError
from paddlecloud.paddlejob import METADATA_FIELDS, _integer, _mapping, _string, refuse_unknown

logger = logging.getLogger(__name__)

TRAININGJOB_API_VERSION = "paddlepaddle.org/v1"
TRAININGJOB_KIND = "TrainingJob"
# Go's encoding/json matched keys in any case: EDL read `VolumeMounts` and `volumeMounts` alike
SPELLINGS = {"VolumeMounts": ("VolumeMounts", "volumeMounts"),
             "NodeSelector": ("NodeSelector", "nodeSelector")}
SPEC_FIELDS = ("image", "port", "ports_num", "ports_num_for_sparse", "fault_tolerant", "passes",
               "host_network", "volumes", *SPELLINGS["VolumeMounts"], *SPELLINGS["NodeSelector"],
               "imagePullSecrets", "trainer", "pserver", "master")
TRAINER_FIELDS = ("entrypoint", "workspace", "passes", "min-instance", "max-instance", "resources",
                  "etcd-endpoint", "replicaSpec")
PSERVER_FIELDS = ("entrypoint", "min-instance", "max-instance", "resources", "replicaSpec")
MASTER_FIELDS = ("resources", "etcd-endpoint", "replicaSpec")
RESOURCE_FIELDS = ("limits", "requests")
PASSES_ENV = "PADDLE_INIT_NUM_PASSES"
# EDL's names for the program, and its defaults (setDefaultAndValidate)
PORT_ENVS = {"port": ("PADDLE_INIT_PORT", 7164), "ports_num": ("PADDLE_INIT_PORTS_NUM", 1),
             "ports_num_for_sparse": ("PADDLE_INIT_PORTS_NUM_FOR_SPARSE", 1)}
# What EDL's controller ran in a pserver: the job image's own script, by fault tolerance
PSERVER_COMMANDS = {True: ["paddle_k8s", "start_new_pserver"], False: ["paddle_k8s", "start_pserver"]}
# Fields EDL's controller filled itself, or that name an etcd paddlecloud does not use: what to
# write instead
REFUSED = {
    "replicaSpec": "EDL's controller generated the {role}'s workload itself and replaced this one; "
                   "for pods of your own write a PaddleJob (batch.paddlepaddle.org/v1) with "
                   "`{template}`",
    "etcd-endpoint": "the job's master uses the etcd of paddlecloud's install, not one per job: "
                     "give it with `paddlecloud job submit --etcd-endpoints` (the operator's "
                     "--etcd-endpoints), and remove this field",
}
TEMPLATE_OF = {"trainer": "spec.worker.template", "pserver": "spec.ps.template",
               "master": "spec.worker.template / spec.ps.template"}


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
    roles = {}
    for role, fields in (("trainer", TRAINER_FIELDS), ("pserver", PSERVER_FIELDS), ("master", MASTER_FIELDS)):
        roles[role] = _mapping(spec.get(role), where=f"spec.{role}")
        refuse_unknown(roles[role], fields, where=f"spec.{role}")
        _refuse_generated(roles[role], role=role)
    trainer, pserver = roles["trainer"], roles["pserver"]
    name = str(meta.get("name") or "")
    fault_tolerant = _fault_tolerant(spec, name=name)
    if roles["master"].get("resources") is not None:
        logger.warning("TrainingJob %s: spec.master.resources is not applied: paddlecloud's per-job "
                       "master (which does EDL's master's work) has its own requests, as EDL's "
                       "controller gave its master fixed ones", name)

    low, high = _instances(trainer, where="spec.trainer", minimum=1)
    pservers, pserver_max = _instances(pserver, where="spec.pserver", minimum=0) if pserver else (0, 0)
    if pserver_max != pservers:
        logger.warning("TrainingJob %s: spec.pserver min-instance %d and max-instance %d differ; "
                       "paddlecloud runs %d pservers (each keeps its slot: pservers do not scale)",
                       name, pservers, pserver_max, pservers)
    passes = _passes(spec, trainer)
    env = _env(spec, trainer, passes=passes, trainers=low, pservers=pservers)
    pod = _pod(spec)
    trainer_container = _container(spec["image"], _entrypoint(trainer, where="spec.trainer", required=True),
                                   trainer.get("workspace"), env=env, mounts=_mounts(spec))
    job_spec: dict[str, Any] = {
        "epochs": passes,
        "worker": {"replicas": low, "requests": low, "limits": high,
                   "template": _template("trainer", trainer_container, trainer.get("resources"), pod,
                                         where="spec.trainer")},
    }
    if spec.get("host_network") is not None and not isinstance(spec["host_network"], bool):
        raise JobSpecError(f"invalid spec.host_network {spec['host_network']!r:.40}: true or false")
    if spec.get("host_network"):
        job_spec["intranet"] = "Host"  # paddle-operator's word for the node's network
    if pservers:
        own = _entrypoint(pserver, where="spec.pserver", required=False)
        command = ["sh", "-c", own] if own else PSERVER_COMMANDS[fault_tolerant]
        workspace = trainer.get("workspace") if own else None
        pserver_container = _container(spec["image"], command, workspace, env=env, mounts=_mounts(spec))
        job_spec["ps"] = {"replicas": pservers,
                          "template": _template("pserver", pserver_container, pserver.get("resources"), pod,
                                                where="spec.pserver")}
    return {"apiVersion": PADDLEJOB_API_VERSION, "kind": PADDLEJOB_KIND,
            # not the annotations: kubectl's and the operator's own bookkeeping is the TrainingJob's
            "metadata": {k: v for k, v in meta.items() if k in ("name", "namespace", "labels")},
            "spec": job_spec}


def _refuse_generated(role_spec: Mapping[str, Any], *, role: str) -> None:
    for key, why in REFUSED.items():
        if key in role_spec:
            raise JobSpecError(f"spec.{role}.{key} is not taken: "
                               + why.format(role=role, template=TEMPLATE_OF[role]))


def _fault_tolerant(spec: Mapping[str, Any], *, name: str) -> bool:
    given = spec.get("fault_tolerant")
    if given is not None and not isinstance(given, bool):
        raise JobSpecError(f"invalid spec.fault_tolerant {given!r:.40}: true or false")
    if given is False:
        logger.warning("TrainingJob %s: fault_tolerant false is run fault-tolerant anyway: every "
                       "paddlecloud job re-queues a dead trainer's tasks and replaces failed pods", name)
    return bool(given)  # EDL's default (an omitted bool) is false: its pservers then start_pserver


def _one_spelling(spec: Mapping[str, Any], field: str) -> tuple[str, Any]:
    """(the key given, its value) of a field EDL read in any case; both spellings is an error."""
    given = [key for key in SPELLINGS[field] if spec.get(key) is not None]
    if len(given) > 1:
        raise JobSpecError(f"spec.{given[0]} and spec.{given[1]} are the same field (EDL read it in "
                           "any case): give one")
    return (given[0], spec[given[0]]) if given else (SPELLINGS[field][0], None)


def _mounts(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    key, mounts = _one_spelling(spec, "VolumeMounts")
    return _list_of_mappings(mounts, where=f"spec.{key}", needs=("name", "mountPath"))


def _list_of_mappings(value: Any, *, where: str, needs: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise JobSpecError(f"{where} must be a list, not {type(value).__name__} {value!r:.40}")
    out = []
    for i, item in enumerate(value):
        item = _mapping(item, where=f"{where}[{i}]")
        for need in needs:
            if not item.get(need):
                raise JobSpecError(f"{where}[{i}] has no {need}")
        out.append(dict(item))
    return out


def _pod(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What EDL put on every pod of the job: volumes, node selector, image pull secrets."""
    pod: dict[str, Any] = {}
    volumes = _list_of_mappings(spec.get("volumes"), where="spec.volumes", needs=("name",))
    if volumes:
        pod["volumes"] = volumes
    key, selector = _one_spelling(spec, "NodeSelector")
    if selector:
        pod["nodeSelector"] = {str(k): _string(v, where=f"spec.{key}.{k}")
                               for k, v in _mapping(selector, where=f"spec.{key}").items()}
    secrets = _list_of_mappings(spec.get("imagePullSecrets"), where="spec.imagePullSecrets", needs=("name",))
    if secrets:
        pod["imagePullSecrets"] = secrets
    return pod


def _passes(spec: Mapping[str, Any], trainer: Mapping[str, Any]) -> int:
    given = {where: value for where, value in (("spec.passes", spec.get("passes")),
                                               ("spec.trainer.passes", trainer.get("passes")))
             if value is not None}
    for where, value in given.items():
        _integer(value, where=where, minimum=1)
    if len(set(given.values())) > 1:
        raise JobSpecError(f"spec.passes {given['spec.passes']} and spec.trainer.passes "
                           f"{given['spec.trainer.passes']} differ: give the job's passes once")
    return next(iter(given.values()), 1)


def _instances(role: Mapping[str, Any], *, where: str, minimum: int) -> tuple[int, int]:
    """(min-instance, max-instance); max defaults to min."""
    if role.get("min-instance") is None:
        raise JobSpecError(f"{where} has no min-instance: give how many to run")
    low = _integer(role["min-instance"], where=f"{where}.min-instance", minimum=minimum)
    high = _integer(role.get("max-instance", low), where=f"{where}.max-instance", minimum=minimum)
    if low > high:
        raise JobSpecError(f"{where}: min-instance {low} is more than max-instance {high}")
    return low, high


def _entrypoint(role: Mapping[str, Any], *, where: str, required: bool) -> str:
    entrypoint = _string(role.get("entrypoint") or "", where=f"{where}.entrypoint")
    if required and not entrypoint.strip():
        raise JobSpecError("the TrainingJob has no spec.trainer.entrypoint: give the command line "
                           "its trainers run (e.g. \"python train.py\")")
    return entrypoint


def _env(spec: Mapping[str, Any], trainer: Mapping[str, Any], *, passes: int, trainers: int,
         pservers: int) -> list[dict[str, str]]:
    """What EDL's controller gave every pod (`podEnv`) that still means something here."""
    env = {PASSES_ENV: str(passes), "ENTRY": str(trainer.get("entrypoint") or ""),
           "TRAINER_PACKAGE": str(trainer.get("workspace") or ""), "TRAINERS": str(trainers),
           "PSERVERS": str(pservers), "PADDLE_INIT_NUM_GRADIENT_SERVERS": str(trainers)}
    for field, (variable, default) in PORT_ENVS.items():
        value = spec.get(field)
        value = default if value in (None, 0) else _integer(value, where=f"spec.{field}", minimum=1)
        env[variable] = str(value)
    return [{"name": k, "value": v} for k, v in env.items()]


def _container(image: str, command: str | list[str], workspace: Any, *, env: list[dict[str, str]],
               mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """A container of the image: `command` (a line runs through the image's sh), in the workspace."""
    argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
    container: dict[str, Any] = {"image": image, "command": argv, "env": [dict(e) for e in env]}
    if workspace:
        container["workingDir"] = _string(workspace, where="spec.trainer.workspace")
    if mounts:
        container["volumeMounts"] = [dict(m) for m in mounts]
    return container


def _template(role: str, container: Mapping[str, Any], resources: Any, pod: Mapping[str, Any], *,
              where: str) -> dict[str, Any]:
    resources = _mapping(resources, where=f"{where}.resources")
    refuse_unknown(resources, RESOURCE_FIELDS, where=f"{where}.resources")
    one = {"name": role, **container}
    if resources:
        one["resources"] = {kind: {str(k): str(v) for k, v in _mapping(amounts, where=f"{where}.resources.{kind}").items()}
                            for kind, amounts in resources.items()}
    return {"spec": {"containers": [one], **copy.deepcopy(dict(pod))}}
