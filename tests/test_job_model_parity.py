"""Every field of the job model is reachable, under one name and one meaning, from every
front door — or listed as not applicable there with the reason (paddlecloud/jobfields.py).

Each check goes through the door itself: `job submit`'s flags parsed by click and built
into a JobSpec (`build_spec`), a PaddleJob document translated (`paddlejob.translate`),
the Python API's `PaddleJob(...)` mapped onto its JobSpec, a Job Server request
validated by its pydantic model and mapped the same way, and `local train`'s flags
parsed by click; the JobSpec field (or local train's parameter) must hold the sample
value given at the door. The negative tests drop one field from one door and expect
the check to report it."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from job_server.models import TrainerJobRequest
from paddlecloud import paddlejob
from paddlecloud.cli.jobs import build_spec, submit_command
from paddlecloud.cli.local import train as local_train_command
from paddlecloud.jobfields import API, CLI, DOORS, LOCAL, PADDLEJOB, SERVER, doors_of
from paddlecloud.jobspec import DataVolume, job_fields
from paddlecloud.sdk import PaddleJob

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent  # a directory that exists, for --package-path
TEMPLATE = {"spec": {"containers": [{"name": "paddle", "image": "paddle:2.5"}]}}
VOLCANO = {"spec": {"schedulerName": "volcano", "containers": [{"name": "paddle", "image": "p"}]}}

# a value unlike the default for every field, as the JobSpec holds it
SAMPLES: dict[str, Any] = {
    "name": "parity-name", "namespace": "team-a", "image": "registry.example/train:1",
    "paddlecloud_image": "registry.example/paddlecloud:2", "module": "pkg.other",
    "package_path": str(PACKAGE), "package_files": ("a.py",), "env": (("GLOG_v", "1"),),
    "secret_env": (("TOKEN", "creds", "token"),), "etcd_endpoints": "http://etcd-a:2379",
    "trainers": 2, "min_trainers": 1, "max_trainers": 4, "pservers": 1, "heters": 1,
    "ps_template": TEMPLATE, "worker_template": VOLCANO, "heter_template": TEMPLATE,
    "trainer_cpu": "500m", "trainer_memory": "8Gi", "trainer_gpu": 2, "pserver_cpu": "3",
    "pserver_memory": "6Gi", "clean_pod_policy": "Never", "scheduler_name": "custom",
    "queue": "gang", "priority_class": "high", "min_resources": {"cpu": "4"}, "min_member": 2,
    "podgroup_name": "pg", "intranet": "Service", "with_gloo": 1, "host_port": 30100,
    "local_queue": "team-queue", "suspend": True, "inputs": ("/data/*.csv",),
    "output": "/out", "epochs": 3, "data_format": "file", "chunk_bytes": 1048576,
    "shuffle_seed": 7, "data_volume": DataVolume("claim", "/mnt"), "restart_limit": 5,
    "elastic": 1, "security_profile": "restricted", "run_as_user": 2000,
    "allow_privileged": True,
}
# what a sample needs beside it to be a valid job
COMPANIONS: dict[str, dict[str, Any]] = {"run_as_user": {"security_profile": "restricted"}}
BASE = {"name": "parity", "module": "pkg.train"}


# ---- the doors, each as a function (field, value) -> the value the door's JobSpec holds --------
def _cli_args(name: str, value: Any) -> list[str]:
    doors = doors_of(_field(name))
    if doors.flag == "NAME":
        return [value]
    spelling = doors.flag_names[-1] if doors.flag_names else "--" + doors.flag.replace("_", "-")
    if doors.flag_value is not None or doors.kind == "flag":
        return [spelling]
    match doors.kind:
        case "paths":
            return [a for v in value for a in (spelling, v)]
        case "pairs":
            return [a for k, v in value for a in (spelling, f"{k}={v}")]
        case "secret_refs":
            return [a for n, s, k in value for a in (spelling, f"{n}={s}/{k}")]
    return [spelling, str(value)]


def through_cli(values: Mapping[str, Any], command: Any = submit_command) -> Any:
    args = [a for name, value in values.items() for a in _cli_args(name, value)]
    if "name" not in values:
        args = [BASE["name"], *args]
    context = command.make_context("submit", [*args, "--module", BASE["module"]]
                                   if "module" not in values else args)
    words = context.params.pop("words")
    options = {k: v for k, v in context.params.items()
               if k not in ("paddlejob", "dry_run", "server", "token", "kubeconfig")}
    options.pop("checkpoint_every")
    return build_spec(name=words[-1] if words else None, paddlejob=None, package=None,
                      options=options)


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    if "[" in path:  # metadata.labels[KEY]
        path, key = path.rstrip("]").split("[")
        doc.setdefault("metadata", {}).setdefault("labels", {})[key] = value
        return
    *parents, last = path.split(".")
    for part in parents:
        doc = doc.setdefault(part, {})
    doc[last] = value


def _yaml_value(name: str, value: Any) -> Any:
    if isinstance(value, DataVolume):
        return {"claim": value.claim, "mountPath": value.mount_path}
    return list(value) if isinstance(value, tuple) else copy.deepcopy(value)


def through_paddlejob(values: Mapping[str, Any], translate: Callable[..., Any] = paddlejob.translate
                      ) -> Any:
    doc: dict[str, Any] = {"apiVersion": "batch.paddlepaddle.org/v1", "kind": "PaddleJob",
                           "metadata": {"name": BASE["name"]},
                           "spec": {"worker": {"replicas": 1, "template": copy.deepcopy(TEMPLATE)}}}
    if any(k in values for k in ("pservers", "heters", "heter_template", "ps_template")):
        doc["spec"]["ps"] = {"replicas": 1, "template": copy.deepcopy(TEMPLATE)}
    if "heters" in values:
        doc["spec"]["heter"] = {"replicas": 1, "template": copy.deepcopy(TEMPLATE)}
    if "heter_template" in values:
        doc["spec"]["heter"] = {"replicas": 1}
    if {"min_trainers", "max_trainers"} & set(values):
        doc["spec"]["worker"]["replicas"] = 2
    group = None
    for name, value in values.items():
        path = doors_of(_field(name)).paddlejob
        if path.startswith("PodGroup "):
            group = {"apiVersion": paddlejob.PODGROUP_API_VERSION, "kind": "PodGroup",
                     "metadata": {"name": value}, "spec": {}}
        else:
            _set(doc, path, _yaml_value(name, value))
    return translate(doc, podgroup=group)


def _api_value(name: str, value: Any) -> dict[str, Any]:
    api = doors_of(_field(name)).api
    if name == "trainer_gpu":
        return {"use_gpu": True, "gpu_num": value}
    if isinstance(value, DataVolume):
        return {api: str(value)}
    if name == "env":
        return {api: dict(value)}
    return {api: list(value) if isinstance(value, tuple) else value}


def _api_body(values: Mapping[str, Any]) -> dict[str, Any]:
    body = {"job_name": BASE["name"], "module": BASE["module"]}
    for name, value in values.items():
        body.update(_api_value(name, value))
    return body


def through_python_api(values: Mapping[str, Any], make: Callable[..., Any] = PaddleJob) -> Any:
    return make(**_api_body(values))._as_request().to_spec()


def through_server(values: Mapping[str, Any],
                   validate: Callable[[dict[str, Any]], Any] = TrainerJobRequest.model_validate
                   ) -> Any:
    return validate(_api_body(values)).to_job().to_spec()


def through_local(values: Mapping[str, Any], command: Any = local_train_command) -> dict[str, Any]:
    """local train's parameters as click parses them (it builds no JobSpec: its own job)."""
    args = [a for name, value in values.items()
            for a in _cli_args(name, value) if doors_of(_field(name)).flag != "NAME"]
    if "name" in values:
        args += ["--job", values["name"]]
    params = command.make_context("train", args).params
    return {name: params[doors_of(_field(name)).local] for name in values}


def _field(name: str) -> dataclasses.Field:
    return next(f for f in job_fields() if f.name == name)


def reach(door: str, name: str, **implementation: Any) -> list[str]:
    """Problems reaching field `name` through `door` with its sample (empty: reached)."""
    doors = doors_of(_field(name))
    if doors.name_at(door) is None:
        return [] if doors.not_at[door].strip() else [f"{name}: no reason why {door} lacks it"]
    values = {**COMPANIONS.get(name, {}), name: SAMPLES[name]}
    through = {CLI: through_cli, PADDLEJOB: through_paddlejob, API: through_python_api,
               SERVER: through_server, LOCAL: through_local}[door]
    try:
        got = through(values, *implementation.values())
    except Exception as error:  # noqa: BLE001 (any refusal is the door failing the field)
        return [f"{name} at {door} ({doors.name_at(door)}): {type(error).__name__}: {error}"]
    held = got[name] if door == LOCAL else getattr(got, name)
    if isinstance(held, Path):
        held = str(held)
    if held != SAMPLES[name]:
        return [f"{name} at {door} ({doors.name_at(door)}): gave {SAMPLES[name]!r}, "
                f"the job holds {held!r}"]
    return []


FIELDS = [f.name for f in job_fields()]


def test_every_field_has_a_sample():
    assert set(FIELDS) <= set(SAMPLES), f"add a sample for {sorted(set(FIELDS) - set(SAMPLES))}"


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("name", FIELDS)
def test_every_field_is_reachable_from_every_door_or_says_why_not(name, door):
    assert reach(door, name) == []


def test_shuffle_seed_is_reachable_from_every_door():
    doors = doors_of(_field("shuffle_seed"))
    assert not doors.not_at
    assert [doors.name_at(d) for d in DOORS] == [
        "shuffle_seed", "spec.shuffleSeed", "shuffle_seed", "shuffle_seed", "shuffle_seed"]


def test_one_name_per_door():
    for door in DOORS:
        names = [doors_of(f).name_at(door) for f in job_fields() if doors_of(f).name_at(door)]
        assert len(names) == len(set(names)), f"{door} takes one name for two fields"


# ---- the check fails when a field is dropped from one door --------------------------------------
def _without_param(command: Any, param: str) -> Any:
    dropped = copy.copy(command)
    dropped.params = [p for p in command.params if p.name != param]
    return dropped


def _dropping(key: str) -> Callable[..., Any]:
    def drop(body: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        given = dict(body if body is not None else kwargs)
        given.pop(key, None)
        return PaddleJob(**given) if body is None else TrainerJobRequest.model_validate(given)
    return drop


def _translate_without(key: str) -> Callable[..., Any]:
    def translate(doc: Mapping[str, Any], **kwargs: Any) -> Any:
        doc = copy.deepcopy(dict(doc))
        doc["spec"].pop(key, None)
        return paddlejob.translate(doc, **kwargs)
    return translate


DROPPED = {
    CLI: lambda: {"command": _without_param(submit_command, "shuffle_seed")},
    PADDLEJOB: lambda: {"translate": _translate_without("shuffleSeed")},
    API: lambda: {"make": _dropping("shuffle_seed")},
    SERVER: lambda: {"validate": _dropping("shuffle_seed")},
    LOCAL: lambda: {"command": _without_param(local_train_command, "shuffle_seed")},
}


@pytest.mark.parametrize("door", DOORS)
def test_the_check_reports_a_field_dropped_from_one_door(door):
    problems = reach(door, "shuffle_seed", **DROPPED[door]())
    assert len(problems) == 1 and problems[0].startswith(f"shuffle_seed at {door}"), problems
    for other in set(DOORS) - {door}:
        assert reach(other, "shuffle_seed") == []


def test_the_check_reports_a_key_the_paddlejob_translation_no_longer_knows(monkeypatch):
    # a new mapping, not delitem: the restored key would come back last, reordering the CRD
    monkeypatch.setattr(paddlejob, "OWN_FIELDS", {k: f for k, f in paddlejob.OWN_FIELDS.items()
                                                  if k != "shuffleSeed"})
    monkeypatch.setattr(paddlejob, "SPEC_FIELDS", tuple(k for k in paddlejob.SPEC_FIELDS
                                                        if k != "shuffleSeed"))
    problems = reach(PADDLEJOB, "shuffle_seed")
    assert problems and "unknown field spec.shuffleSeed" in problems[0]


# ---- the code that acts on shuffle_seed: the master gets it, on either backend -------------------
def test_the_kubernetes_master_gets_the_shuffle_seed():
    from paddlecloud.backends.k8s import manifests

    command = manifests.master_command(through_cli({"shuffle_seed": 7, "inputs": ("/d/*.csv",)}))
    assert command[command.index("--shuffle-seed") + 1] == "7"


def test_the_local_master_gets_the_shuffle_seed():
    from paddlecloud.master_flags import master_flags

    params = through_local({"shuffle_seed": 7})
    flags = master_flags(job="j", namespace="n", etcd_endpoints="http://e:2379", port=1,
                         advertise="a:1", inputs=("/d",), shuffle_seed=params["shuffle_seed"])
    assert flags[flags.index("--shuffle-seed") + 1] == "7"


# ---- a JobSpec written back as a PaddleJob (the Job Server through the operator) loses nothing ---
@pytest.mark.parametrize("name", sorted(f.name for f in paddlejob.OWN_FIELDS.values()))
def test_a_spec_written_as_a_paddlejob_reads_back_the_same(name):
    from paddlecloud.backends.k8s.jobs import paddlejob_document
    from paddlecloud.jobspec import JobSpec

    spec = JobSpec(**BASE, **COMPANIONS.get(name, {}), **{name: SAMPLES[name]})
    assert getattr(paddlejob.translate(paddlejob_document(spec)), name) == SAMPLES[name]


@pytest.mark.parametrize("name", ["restart_limit", "pservers", "trainer_gpu", "shuffle_seed"])
def test_a_zero_given_at_the_command_line_is_kept(name):
    """0 is a value (`--restart-limit 0`: fail at the first lost trainer), not "not given"."""
    assert getattr(through_cli({name: 0}), name) == 0


# ---- `job submit --queue -f`: the flags a PaddleJob holds are written into it, from the model -----
def _worker_only() -> dict[str, Any]:
    return {"apiVersion": "batch.paddlepaddle.org/v1", "kind": "PaddleJob",
            "metadata": {"name": BASE["name"]},
            "spec": {"worker": {"replicas": 1, "template": copy.deepcopy(TEMPLATE)}}}


QUEUED = sorted(f.name for f in paddlejob.OWN_FIELDS.values() if doors_of(f).flag)


@pytest.mark.parametrize("name", QUEUED)
def test_a_queued_submit_writes_every_own_flag_into_the_paddlejob(name, tmp_path):
    from paddlecloud.backends.k8s.queued import queued_paddlejob

    values = {**COMPANIONS.get(name, {}), name: SAMPLES[name]}
    args = [a for n, v in values.items() for a in _cli_args(n, v)]
    params = submit_command.make_context("submit", ["parity", *args]).params
    options = {k: v for k, v in params.items()
               if k not in ("words", "paddlejob", "dry_run", "server", "token", "kubeconfig", "queue")}
    queued = queued_paddlejob([_worker_only()], queue="q", name=None, options=options)
    assert getattr(paddlejob.translate(queued), name) == SAMPLES[name]


def test_a_queued_submit_keeps_a_restart_limit_of_zero():
    from paddlecloud.backends.k8s.queued import queued_paddlejob

    queued = queued_paddlejob([_worker_only()], queue="q", name=None, options={"restart_limit": 0})
    assert queued["spec"]["restartLimit"] == 0


def test_the_python_api_takes_input_as_a_glob_like_the_cli_and_a_list_as_seed_001():
    one = PaddleJob(job_name="parity", module="pkg.train", input="/data/*.csv")
    listed = PaddleJob(job_name="parity", module="pkg.train", input=["/data/*.csv"])
    assert one._as_request().to_spec().inputs == listed._as_request().to_spec().inputs == (
        through_cli({"inputs": ("/data/*.csv",)}).inputs)
