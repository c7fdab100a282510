"""`paddlecloud job ...`: submit, list, inspect, follow and delete jobs on Kubernetes.

`submit` creates only the job's master (a Deployment of two replicas, the root
owner of everything else), its Service and the job-spec (and package) ConfigMaps;
the leading master deploys the pservers and trainers (`paddlecloud.backends.k8s.deployer`). Every
API call goes through `paddlecloud.backends.k8s.client` (retries, errors that say what to do).
`delete` removes the Deployment — the API server's garbage collector removes what
it owns — plus the ConfigMaps, and clears the job's etcd prefix.

Kubeconfig: `--kubeconfig`, else in-cluster credentials, else ~/.kube/config
($KUBECONFIG). The `kubernetes`, `grpc` and `rich` imports happen inside the
commands, so `paddlecloud --help` stays fast.

What this does NOT guarantee: `status` reads the master through its Service
address, which resolves only inside the cluster; from outside, port-forward it
and pass `--master` (the command says so when it cannot reach the master).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import click

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.jobs import (
    ROLES,
    JobCreateError,
    create_job,
    fetch_master_status,
    master_ca,
    pick_pod,
    pod_counts,
    read_package,
    scale_trainers,
)
from paddlecloud.cli.spec_options import submit_options, values_of
from paddlecloud.clitypes import POSITIVE, SeedSpellings
from paddlecloud.epoch_text import epoch_of
from paddlecloud.goodput_text import summarize_trainer_seconds
from paddlecloud.jobspec import PADDLEJOB_KIND, SECTION_OF, JobSpec, JobSpecError
from paddlecloud.paddlejob import load_documents, translate_documents
from paddlecloud.trainingjob import is_trainingjob, to_paddlejob

logger = logging.getLogger(__name__)

CLI_RETRY_ATTEMPTS, CLI_RETRY_WAIT = 3, 0.5
USER_RIGHTS = ("Ask your cluster's admin for it in this namespace "
               "(docs/kubernetes.md lists what `paddlecloud job` needs)")


def _fail(message: str) -> click.ClickException:
    return click.ClickException(message)


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def _kubeconfig_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--kubeconfig", type=click.Path(dir_okay=False),
                      help="Kubeconfig file (default: in-cluster, then ~/.kube/config).")(fn)
    return fn


def _namespace_option(default: str | None = "default") -> Callable[..., Any]:
    help_text = "Kubernetes namespace of the job." + (
        "" if default else "  [default: the PaddleJob's, else default]")
    return click.option("-n", "--namespace", default=default, show_default=default is not None,
                        help=help_text)


def _api(kubeconfig: str | None) -> Any:
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        raise _fail("`paddlecloud job` needs the Kubernetes client: pip install 'paddlecloud[k8s]'") from None
    from paddlecloud.backends.k8s.client import KubernetesApiError, load_api_client

    try:
        return load_api_client(kubeconfig)
    except KubernetesApiError as error:
        raise _fail(str(error)) from None
    except Exception as error:  # a broken kubeconfig file
        raise _fail(f"cannot load the Kubernetes configuration {kubeconfig or ''}: {error}") from None


def _call(fn: Callable[..., Any], *args: Any, verb: str, resource: str, namespace: str,
          name: str = "", tolerate: Collection[int] = (), **kwargs: Any) -> Any:
    """One API call, retried as the deployer's are; None for an answer in `tolerate`
    (e.g. 404 when a missing object is fine), any other API error a clear CLI error."""
    from paddlecloud.backends.k8s.client import RetryPolicy, api_status, call_sync, explained

    try:
        return call_sync(RetryPolicy(attempts=CLI_RETRY_ATTEMPTS, initial_wait=CLI_RETRY_WAIT),
                         fn, *args, **kwargs)
    except Exception as error:
        if api_status(error) in tolerate:
            return None
        clear = explained(error, verb=verb, resource=resource, namespace=namespace, name=name,
                          rights=USER_RIGHTS)
        if clear is error:  # a bug, not an answer of the API: as it is
            raise
        raise _fail(str(clear)) from None


def _get(fn: Callable[..., Any], name: str, namespace: str, *, resource: str) -> Any:
    """The object `name` of `resource`, None when it does not exist."""
    return _call(fn, name, namespace, verb="get", resource=resource, namespace=namespace,
                 name=name, tolerate=(404,))


def _clients(api: Any) -> tuple[Any, Any]:
    from kubernetes import client

    return client.CoreV1Api(api), client.AppsV1Api(api)


@click.group("job")
def job() -> None:
    """Run jobs on Kubernetes: submit, list, status, logs, delete."""


# ---- submit ----------------------------------------------------------------------------------
def _load_paddlejob(path: str) -> list[dict[str, Any]]:
    """The documents of a PaddleJob file (the PaddleJob, and its PodGroup if any); an EDL
    TrainingJob is read as the PaddleJob it converts to (`paddlecloud.trainingjob`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise JobSpecError(f"cannot read {path}: {error}") from None
    return [to_paddlejob(doc) if is_trainingjob(doc) else doc
            for doc in load_documents(text, source=path)]


# the fields a PaddleJob's spec.ps / spec.worker give: replicas and resources
POD_SHAPE_SECTIONS = ("topology", "resources")


def build_spec(*, name: str | None, paddlejob: str | None, package: Mapping[str, bytes] | None,
               options: Mapping[str, Any]) -> JobSpec:
    """The JobSpec of `submit`'s flags, or of a PaddleJob file plus the flags that may join it."""
    values = values_of(options)
    if package is not None:
        values["package_files"] = tuple(sorted(package))
    pod_shape = [k for k in values if SECTION_OF[k] in POD_SHAPE_SECTIONS]
    if paddlejob is not None:
        given = [k for k in pod_shape if values[k] is not None]
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise JobSpecError(
                f"{flags} cannot be combined with -f: set replicas and resources in the PaddleJob's "
                "spec.ps / spec.worker"
            )
        docs = _load_paddlejob(paddlejob)
        return translate_documents(docs, source=paddlejob, name=name, **values)
    if not name:
        raise JobSpecError("no job name: give NAME (or -f job.yaml with metadata.name)")
    if ("." in name or "/" in name) and (name.endswith((".yaml", ".yml", ".json")) or Path(name).is_file()):
        # `kubectl apply job.yaml` habits. No job name holds '.' or '/': refused either way,
        # but "invalid job name" would hide why.
        raise JobSpecError(f"NAME {name[:60]!r} is a file, not a job name: give a PaddleJob "
                           "file with -f, or a job name")
    values = {k: v for k, v in values.items() if v is not None}
    if "trainers" not in values and values.get("max_trainers") is not None:
        values["trainers"] = values["max_trainers"]  # an elastic job starts at its most
    return JobSpec(name=name, **values)


def render_dry_run(spec: JobSpec, package: Mapping[str, bytes] | None) -> str:
    """The YAML stream of everything the job will have: what submit creates, what the master will."""
    parts = [f"# paddlecloud job {spec.name} in namespace {spec.namespace}\n"
             "# created by `paddlecloud job submit`:\n"]
    for obj in manifests.submit_objects(spec, package):
        parts.append("---\n" + manifests.dump_yaml(obj))
    parts.append(f"# created by the job's leading master at run time, owned by Deployment "
                 f"{manifests.master_name(spec.name)} (ownerReferences are filled in then):\n")
    for obj in manifests.master_objects(spec, None):
        parts.append("---\n" + manifests.dump_yaml(obj))
    return "".join(parts)


def _with_checkpoint_every(options: dict[str, Any]) -> dict[str, Any]:
    """`options` with `--checkpoint-every` turned into one more `-e` value, as `local train`
    does: the trainers read it from their environment, so nothing else needs to carry it."""
    from paddlecloud.clitypes import checkpoint_every_env

    every = options.pop("checkpoint_every", None)
    if not every:
        return options
    key, value = checkpoint_every_env(every)
    if any(pair.partition("=")[0] == key for pair in options["env"]):
        # spec.validate would say only "given twice", hiding that the flag sets it too
        raise click.UsageError(f"--checkpoint-every {every} sets {key}, which -e sets as well: "
                               "give one of them")
    return {**options, "env": (*options["env"], f"{key}={value}")}


def _job_name_of(words: tuple[str, ...]) -> str | None:
    """NAME of `job submit [train] NAME`: seed 002's `paddle job submit train NAME` names the
    kind of job first; a job may still be called `train` (`job submit train --module ...`)."""
    if len(words) == 2 and words[0] == "train":
        return words[1]
    if len(words) > 1:
        raise click.UsageError(f"job submit takes one NAME (or 'train NAME', as the paddle client "
                               f"writes it), got {' '.join(words)[:80]!r}")
    return words[0] if words else None


@job.command("submit", cls=SeedSpellings)
@click.argument("words", nargs=-1, metavar="[train] NAME")
@click.option("-f", "--file", "paddlejob", type=click.Path(exists=True, dir_okay=False),
              help="A paddle-operator PaddleJob YAML (batch.paddlepaddle.org/v1), or an EDL "
                   "TrainingJob (paddlepaddle.org/v1).")
@submit_options
@click.option("--checkpoint-every", metavar="TASKS|DURATION",
              help="Checkpoint inside epochs too, every TASKS tasks of the job (20) or DURATION "
                   "(30s): a group restart then resumes mid-epoch (the trainers read it from "
                   "PADDLECLOUD_CHECKPOINT_EVERY, passed as -e values are).")
@click.option("--dry-run", is_flag=True, help="Print the manifests as a YAML stream; touch nothing.")
@click.option("--server", metavar="URL", help="Submit through this Job Server (no kubeconfig needed).")
@click.option("--token", envvar="PADDLE_JOB_TOKEN", show_envvar=True, help="The Job Server token.")
@_kubeconfig_option
def submit_command(words: tuple[str, ...], paddlejob: str | None, dry_run: bool, server: str | None,
                   token: str | None, kubeconfig: str | None, **options: Any) -> None:
    """Submit job NAME: its master deploys the pservers and trainers.

    `job submit train NAME` (the paddle client's form) is the same as `job submit NAME`.
    With etcd's root credentials in the environment (PADDLE_ETCD_USER,
    PADDLE_ETCD_PASSWORD_FILE) the job also gets an etcd user of its own, allowed only
    the job's keys (docs/kubernetes.md, "etcd").
    """
    name = _job_name_of(words)
    if options["queue"] is None and paddlejob is not None:
        options["queue"] = _file_queue(paddlejob)
    if options["queue"] is not None:
        _submit_queued(name, paddlejob, dry_run=dry_run, server=server, kubeconfig=kubeconfig,
                       options=options)
        return
    options = _with_checkpoint_every(options)
    try:
        package = read_package(Path(options["package_path"]), warn=_warn) if options["package_path"] else None
        if package is not None and paddlejob is None:
            package = _placed_package(package, options)
        spec = build_spec(name=name, paddlejob=paddlejob, package=package, options=options)
        spec.validate()
        objects = manifests.submit_objects(spec, package)
        manifests.master_objects(spec, None)  # renders the pods now: template errors surface here
    except JobSpecError as error:
        raise _fail(str(error)) from None
    if dry_run:
        click.echo(render_dry_run(spec, package), nl=False)
        return
    if server:
        _submit_to_server(spec, server=server, token=token, namespace=options["namespace"])
        return
    api = _api(kubeconfig)
    try:
        create_job(api, spec=spec, objects=objects, rights=USER_RIGHTS)
    except JobCreateError as error:
        raise _fail(str(error)) from None
    click.echo(f"job {spec.name} submitted to namespace {spec.namespace}: "
               f"paddlecloud job status {spec.name} -n {spec.namespace}")


def _file_queue(path: str) -> str | None:
    """The Kueue queue a PaddleJob file's label names (None: none): such a job is submitted
    queued, as with --queue, by the dry run and the real submit alike."""
    from paddlecloud.paddlejob import KUEUE_QUEUE_LABEL

    try:
        docs = _load_paddlejob(path)
    except JobSpecError as error:
        raise _fail(str(error)) from None
    metas = [d.get("metadata") for d in docs if d.get("kind") == PADDLEJOB_KIND]
    labels = [m.get("labels") for m in metas if isinstance(m, Mapping)]
    queues = [str(ls[KUEUE_QUEUE_LABEL]) for ls in labels
              if isinstance(ls, Mapping) and ls.get(KUEUE_QUEUE_LABEL)]
    return queues[0] if queues else None


def _placed_package(package: dict[str, bytes], options: dict[str, Any]) -> dict[str, bytes]:
    """The package as the pods import it, `options["module"]` its entry point: --module in
    either form (the folder as the import root, or as the module's top package: seed 002's
    --package-path=./demo --module=demo.train), or its train.py / trainer.py without one.
    A module not in the package is refused, unless --image may hold it."""
    from paddlecloud.trainer_package import entry_point

    folder = Path(options["package_path"]).absolute()
    try:
        entry = entry_point(options["module"] or "", package, folder=folder.name,
                            where=f"--package-path {str(folder)[:200]}")
    except JobSpecError:
        if options["module"] and options["image"]:
            return package  # the image's own module, maybe: only its pods can tell
        raise
    options["module"] = entry.module
    return entry.placed(package)


def _submit_queued(name: str | None, paddlejob: str | None, *, dry_run: bool, server: str | None,
                   kubeconfig: str | None, options: dict[str, Any]) -> None:
    """`--queue`: the PaddleJob, labelled for Kueue, for the operator to run once admitted."""
    from paddlecloud.backends.k8s.queued import queued_paddlejob

    queue = options.pop("queue")
    if server:
        raise _fail("--queue (or the file's kueue.x-k8s.io/queue-name label) cannot be combined "
                    "with --server: the Job Server creates jobs "
                    "straight away; a queued job is a PaddleJob the operator runs once Kueue "
                    "admits it")
    if paddlejob is None:
        raise _fail("--queue needs -f job.yaml: a queued job is a PaddleJob (its pod templates "
                    "say what --module, --image and the resources would) that the operator runs "
                    "once Kueue admits it")
    try:
        doc = queued_paddlejob(_load_paddlejob(paddlejob), queue=queue, name=name,
                               options=options)
    except JobSpecError as error:
        raise _fail(str(error)) from None
    if dry_run:
        click.echo(manifests.dump_yaml(doc), nl=False)
        return
    from paddlecloud.backends.k8s.jobs import create_paddlejob_document

    try:
        create_paddlejob_document(_api(kubeconfig), doc, rights=USER_RIGHTS)
    except JobCreateError as error:
        raise _fail(str(error)) from None
    meta = doc["metadata"]
    click.echo(f"PaddleJob {meta['name']} queued in {queue} (namespace {meta['namespace']}): "
               f"kubectl get pdj {meta['name']} -n {meta['namespace']}")


def _submit_to_server(spec: JobSpec, *, server: str, token: str | None,
                      namespace: str | None) -> None:
    from paddlecloud.sdk import JobServerError, submit_spec

    if not token:
        raise _fail("--server needs --token (or PADDLE_JOB_TOKEN)")
    try:
        handle = submit_spec(spec, server=server, token=token, namespace=namespace)
    except (JobSpecError, JobServerError, OSError) as error:
        raise _fail(f"the Job Server at {server}: {error}") from None
    click.echo(f"job {handle.name} submitted to namespace {handle.namespace} through {server}")


# ---- list ---------------------------------------------------------------------------------------
def _age(created: Any) -> str:
    import datetime

    if not created:
        return "-"
    if isinstance(created, str):
        created = datetime.datetime.fromisoformat(created.replace("Z", "+00:00"))
    seconds = (datetime.datetime.now(datetime.timezone.utc) - created).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


@job.command("list")
@_namespace_option()
@_kubeconfig_option
def list_command(namespace: str, kubeconfig: str | None) -> None:
    """List the jobs of a namespace, with their phase."""
    from rich.console import Console
    from rich.table import Table

    api = _api(kubeconfig)
    _, apps = _clients(api)
    selector = f"{manifests.APP_LABEL}={manifests.APP_NAME},{manifests.ROLE_LABEL}={manifests.MASTER}"
    found = _call(apps.list_namespaced_deployment, namespace, label_selector=selector,
                  verb="list", resource="deployments", namespace=namespace)
    table = Table("JOB", "PHASE", "MASTERS READY", "AGE", box=None, pad_edge=False)
    rows = 0
    for item in sorted(found.items or [], key=lambda d: d.metadata.name):
        labels = item.metadata.labels or {}
        job_name = labels.get(manifests.JOB_LABEL)
        if not job_name:
            continue
        phase = (item.metadata.annotations or {}).get(manifests.PHASE_ANNOTATION, "-")
        ready = (item.status.ready_replicas if item.status else None) or 0
        table.add_row(job_name, phase, f"{ready}/{item.spec.replicas}",
                      _age(item.metadata.creation_timestamp))
        rows += 1
    console = Console(file=sys.stdout, width=120)
    if rows:
        console.print(table)
    else:
        console.print(f"no paddlecloud jobs in namespace {namespace}")


# ---- status -------------------------------------------------------------------------------------
def viewer_token_command(name: str, namespace: str) -> str:
    """The kubectl command that prints job `name`'s viewer token (its Secret, key `viewer`)."""
    return (f"kubectl -n {namespace} get secret {manifests.tokens_secret_name(name)} "
            "-o jsonpath='{.data.viewer}' | base64 -d")


def status_page_instructions(name: str, namespace: str, *, local_port: int,
                             token: str | None) -> str:
    """How to reach a Kubernetes job's status page: its master Service's page port, forwarded,
    and a URL with the job's viewer `token` (the page's data needs one); without the token,
    the URL has a placeholder and a line says where the token is."""
    from urllib.parse import quote

    shown = quote(token, safe="") if token else "TOKEN"
    text = (f"the status page of job {name} is served by its leading master on port "
            f"{manifests.METRICS_PORT}; from outside the cluster run\n"
            f"  kubectl -n {namespace} port-forward svc/{manifests.master_name(name)} "
            f"{local_port}:{manifests.METRICS_PORT}\n"
            f"and open http://127.0.0.1:{local_port}/?token={shown}")
    if token:
        return text
    return (text + f"\nno viewer token: Secret {manifests.tokens_secret_name(name)} (key viewer) "
            f"could not be read; replace TOKEN with what `{viewer_token_command(name, namespace)}` "
            "prints (it needs get on secrets)")


def _secret_viewer_token(core: Any, name: str, namespace: str) -> str | None:
    """The job's viewer token from its Secret; None when the API refuses it (403, 404, other)."""
    from paddlecloud.backends.k8s.jobs import viewer_token

    try:
        return viewer_token(core.api_client, namespace=namespace, name=name)
    except JobCreateError:
        return None


def _viewer_token(core: Any, name: str, namespace: str) -> str | None:
    """The job's viewer token from its Secret, when PADDLE_JOB_TOKEN_FILE names none and the
    caller may read Secrets; else None (the master then answers UNAUTHENTICATED)."""
    from paddlecloud.auth import ENV_TOKEN_FILE

    if os.environ.get(ENV_TOKEN_FILE):
        return None
    return _secret_viewer_token(core, name, namespace)


@job.command("status")
@click.argument("name")
@_namespace_option()
@click.option("--master", "master_address", metavar="HOST:PORT",
              help="The master's gRPC address (default: its Service, NAME-master.NS.svc:8080).")
@click.option("--timeout", type=float, default=3.0, show_default=True,
              help="Seconds to wait for the master, retrying while it is away or busy.")
@click.option("--web", is_flag=True,
              help="Print how to open the job's status page: a kubectl port-forward and its URL "
                   "with the job's viewer token (read from its Secret NAME-tokens).")
@click.option("--local-port", type=click.IntRange(1, 65535), default=manifests.METRICS_PORT,
              show_default=True, help="With --web: the local end of the port-forward.")
@_kubeconfig_option
def status_command(name: str, namespace: str, master_address: str | None, timeout: float,
                   web: bool, local_port: int, kubeconfig: str | None) -> None:
    """Phase, pods per role, and the master's progress of job NAME.

    With --web, the commands that open the job's status page from outside the
    cluster, its URL carrying the job's viewer token (this CLI does not hold a
    port-forward open itself)."""
    import grpc
    from rich.console import Console
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    api = _api(kubeconfig)
    core, apps = _clients(api)
    deployment = _get(apps.read_namespaced_deployment, manifests.master_name(name), namespace,
                      resource="deployments")
    if deployment is None:
        raise _fail(f"job {name} not found in namespace {namespace}")
    if web:
        click.echo(status_page_instructions(name, namespace, local_port=local_port,
                                            token=_secret_viewer_token(core, name, namespace)))
        return
    pods = _call(core.list_namespaced_pod, namespace, label_selector=manifests.label_selector(name),
                 verb="list", resource="pods", namespace=namespace)
    counts = pod_counts(pods.items or [], name)
    console = Console(file=sys.stdout, width=100)
    annotations = deployment.metadata.annotations or {}
    phase = annotations.get(manifests.PHASE_ANNOTATION, "-")
    reason = annotations.get(manifests.PHASE_REASON_ANNOTATION)
    console.print(f"job {name} in namespace {namespace}: phase {phase}"
                  + (f" ({reason})" if reason else ""))
    table = Table("ROLE", *(p.upper() for p in manifests.POD_PHASES), box=None, pad_edge=False)
    for role in ROLES:
        c = counts[role]
        table.add_row(role, *(str(c.get(p, 0)) for p in manifests.POD_PHASES))
    console.print(table)

    address = master_address or manifests.master_address(name, namespace)
    try:
        # the job's CA, published on its Deployment (its certificate names the Service and loopback)
        ca = master_ca(annotations)
        reply = fetch_master_status(address, timeout=timeout, token=_viewer_token(core, name, namespace),
                                    ca=ca)
    except grpc.RpcError as error:
        code = error.code() if hasattr(error, "code") else None
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            console.print(
                f"master: refused our token at {address} ({code.name}); showing the pods only. Give "
                f"PADDLE_JOB_TOKEN_FILE a token of the job: {viewer_token_command(name, namespace)}")
            return
        console.print(
            f"master: unreachable at {address} ({getattr(code, 'name', code)}); showing the pods "
            f"only. From outside the cluster: kubectl -n {namespace} port-forward "
            f"svc/{manifests.master_name(name)} 8080 and pass --master 127.0.0.1:8080"
        )
        return
    console.print(f"master: leader {reply.leader or '-'}, phase {reply.phase or '-'}, "
                  f"{reply.trainers_alive} trainer(s) alive")
    if reply.desired_trainers:
        console.print(f"trainers: desired {reply.desired_trainers}, range "
                      f"{reply.min_trainers}..{reply.max_trainers}, alive {reply.trainers_alive}")
    goodput = summarize_trainer_seconds({e.cause: e.seconds for e in reply.trainer_seconds})
    if goodput:
        console.print(goodput)
    if reply.pserver_endpoints:
        console.print(f"pservers: {', '.join(reply.pserver_endpoints)}")
    if not reply.has_dataset:
        console.print("no dataset: the job runs in deploy-and-monitor mode")
        return
    counts_ = reply.counts
    done, total = counts_.done, max(reply.num_tasks, 1)
    console.print(f"{epoch_of(reply.current_epoch, reply.num_epochs)}: tasks {done}/{reply.num_tasks} done "
                  f"(todo {counts_.todo}, pending {counts_.pending}, failed {counts_.failed})")
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=total, completed=done, width=60), f"{100 * done // total}%")
    console.print(bar)


def _master_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--master and --timeout of a command that calls a job's master as its operator."""
    command = click.option("--timeout", type=float, default=10.0, show_default=True,
                           help="Seconds to wait for the master, retrying while it is away or busy.")(command)
    return click.option("--master", "master_address", metavar="HOST:PORT",
                        help="The master's gRPC address (default: its Service, NAME-master.NS.svc:8080; "
                             "a local job's leader is shown by `paddlecloud local train`).")(command)


@job.command("scale")
@click.argument("name")
@click.option("--trainers", type=POSITIVE, required=True,
              help="The trainer group's new size, within the job's range.")
@_namespace_option()
@click.option("--output", "local_output", type=click.Path(file_okay=False, path_type=Path),
              help="A local job: the --output of its `paddlecloud local train`, which holds its "
                   "leader's address and its operator token.")
@_master_options
@_kubeconfig_option
def scale_command(name: str, trainers: int, namespace: str, local_output: Path | None,
                  master_address: str | None, timeout: float, kubeconfig: str | None) -> None:
    """Set the trainers of job NAME to --trainers; its deployer converges to it.

    PS jobs add or remove trainers while the others go on; collective jobs restart
    the trainer group at the new size. A local job: pass its --output
    (`paddlecloud job scale fit-a-line --output output/fit-a-line --trainers 3`).
    Scaling is the operator's: PADDLE_JOB_TOKEN_FILE names the job's operator token (on
    Kubernetes the `operator` key of the job's NAME-tokens Secret), PADDLE_MASTER_CA_FILE
    the master's CA when it uses TLS (without it, the CA published on the job's Deployment;
    with --master, a job without a Deployment or Kubernetes configuration is taken for a
    local one: plaintext, or PADDLE_MASTER_CA_FILE when it uses TLS).
    """
    import grpc

    if local_output is not None:
        if master_address:
            raise click.UsageError("give --output (a local job) or --master, not both")
        reply = _scale_local(name, trainers, local_output, timeout=timeout)
        click.echo(f"job {name}: desired trainers {reply.desired_trainers} "
                   f"(range {reply.min_trainers}..{reply.max_trainers})")
        return

    address, ca = _operator_target(name, namespace, master_address, kubeconfig)
    try:
        reply = scale_trainers(address, trainers, timeout=timeout, ca=ca)
    except grpc.RpcError as error:
        raise _fail(f"cannot scale job {name} at {address}: {error.details()}") from None
    click.echo(f"job {name}: desired trainers {reply.desired_trainers} "
               f"(range {reply.min_trainers}..{reply.max_trainers})")


def _scale_local(name: str, trainers: int, output: Path, *, timeout: float) -> Any:
    """ScaleTrainers on the local job whose output directory is `output`, as its operator: the
    last leader its supervisor saw first, then its other masters (a failover meanwhile)."""
    import grpc

    from paddlecloud.auth import ClientCredentials
    from paddlecloud.backends.local.handle import (
        LocalJobHandle,
        NoLocalJob,
        master_ca,
        operator_token,
    )

    try:
        handle = LocalJobHandle.read(output)
        credentials = ClientCredentials(token=operator_token(output), ca=master_ca(output))
    except (NoLocalJob, OSError) as error:
        raise _fail(str(error)) from None
    if handle.job != name:
        raise _fail(f"{str(output)[:200]} is local job {handle.job}'s output, not {name}'s")
    error: grpc.RpcError | None = None
    for address in handle.addresses():
        try:
            return scale_trainers(address, trainers, timeout=timeout, credentials=credentials)
        except grpc.RpcError as failed:
            error = failed
            if failed.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                break  # the leader answered: a refused size, a bad token
    details = error.details() if error is not None else "no master known yet; try again"
    raise _fail(f"cannot scale local job {name}: {details}")


def _operator_target(name: str, namespace: str, master_address: str | None,
                     kubeconfig: str | None) -> tuple[str, bytes | None]:
    """(the master's address, its CA) for an operator's call to job NAME (`job scale`, `job evict`)."""
    from paddlecloud.auth import ENV_CA_FILE

    address = master_address or manifests.master_address(name, namespace)
    if os.environ.get(ENV_CA_FILE):
        return address, None
    try:
        _, apps = _clients(_api(kubeconfig))
        deployment = _get(apps.read_namespaced_deployment, manifests.master_name(name), namespace,
                          resource="deployments")
    except click.ClickException:
        if master_address is None:
            raise
        deployment = None  # no Kubernetes here: a local job
    if deployment is None and master_address is None:
        raise _fail(f"job {name} not found in namespace {namespace}")
    return address, master_ca(deployment.metadata.annotations) if deployment is not None else None


@job.command("evict")
@click.argument("name")
@click.argument("trainer_id")
@_namespace_option()
@_master_options
@_kubeconfig_option
def evict_command(name: str, trainer_id: str, namespace: str, master_address: str | None,
                  timeout: float, kubeconfig: str | None) -> None:
    """End the session of trainer TRAINER_ID of job NAME (e.g. a rogue one).

    Its tasks return to the others at once, no failure counted, and its process is told
    to stop at its next call, as when superseded; a new process of that id may register
    again. The operator's call, with the credentials of `job scale`.
    """
    import grpc

    from paddlecloud.auth import master_credentials
    from paddlecloud.master_client import ask_master

    address, ca = _operator_target(name, namespace, master_address, kubeconfig)
    try:
        reply = ask_master(address, lambda master: master.evict_trainer(trainer_id), timeout=timeout,
                           credentials=master_credentials(None, ca=ca))
    except grpc.RpcError as error:
        raise _fail(f"cannot evict trainer {trainer_id} of job {name} at {address}: {error.details()}") from None
    click.echo(f"job {name}: trainer {trainer_id} evicted (session {reply.session_id}, "
               f"{reply.tasks_returned} task(s) back to todo)")


# ---- logs -------------------------------------------------------------------------------------
def _pick_pod(api: Any, *, name: str, namespace: str, role: str, index: int) -> Any:
    try:
        pod = pick_pod(api, name=name, namespace=namespace, role=role, index=index,
                       rights=USER_RIGHTS)
    except JobCreateError as error:
        raise _fail(str(error)) from None
    if pod is None:
        raise _fail(f"no {role} pod with index {index} for job {name} in namespace {namespace}")
    return pod


@job.command("logs")
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), default=manifests.TRAINER, show_default=True,
              help="Whose log: a trainer's, a pserver's or a master's.")
@click.option("--index", type=int, default=0, show_default=True,
              help="Trainer id, pserver index, or master number (0: the leader).")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new lines.")
@_namespace_option()
@_kubeconfig_option
def logs_command(name: str, role: str, index: int, follow: bool, namespace: str,
                 kubeconfig: str | None) -> None:
    """Print the log of one pod of job NAME."""
    api = _api(kubeconfig)
    core, _ = _clients(api)
    pod = _pick_pod(api, name=name, namespace=namespace, role=role, index=index)
    containers = pod.spec.containers if pod.spec else []
    container = containers[0].name if containers else None
    response = _call(core.read_namespaced_pod_log, pod.metadata.name, namespace, container=container,
                     follow=follow, _preload_content=False, verb="get", resource="pods/log",
                     namespace=namespace, name=pod.metadata.name)
    out = sys.stdout.buffer
    try:
        for chunk in response.stream(4096):
            out.write(chunk)
            out.flush()
    finally:
        response.release_conn()


# ---- delete -------------------------------------------------------------------------------------
async def clear_etcd_prefix(endpoints: str, *, namespace: str, job_name: str, timeout: float) -> int:
    """Deletes every key of the job under /paddlecloud/NS/NAME/, and its etcd user where
    this process logs in as one; returns how many keys went."""
    from paddlecloud.etcd_users import forget_job

    return await forget_job(endpoints, namespace=namespace, job=job_name, timeout=timeout)


@job.command("delete")
@click.argument("name")
@_namespace_option()
@click.option("--etcd-endpoints", help="Clear the job's etcd keys here (default: the job spec's).")
@_kubeconfig_option
def delete_command(name: str, namespace: str, etcd_endpoints: str | None,
                   kubeconfig: str | None) -> None:
    """Delete job NAME: its master (and so everything it owns), its ConfigMaps, its etcd keys
    (and its etcd user, with etcd's root credentials in the environment). When its etcd does
    not answer, everything but its spec ConfigMap goes and the command fails saying so: run it
    again once that etcd answers (the Job Server's DELETE does the same)."""
    from paddlecloud.backends.k8s.jobs import delete_job

    api = _api(kubeconfig)
    cleared: list[int] = []
    try:
        deleted = delete_job(api, namespace=namespace, name=name, rights=USER_RIGHTS,
                             etcd_endpoints=etcd_endpoints, on_cleared=cleared.append)
    except JobCreateError as error:
        raise _fail(str(error)) from None
    if not deleted:
        raise _fail(f"job {name} not found in namespace {namespace}")
    click.echo(f"deleted {', '.join(deleted)} (the pservers, trainers and Services go with the "
               "Deployment)")
    if cleared:
        click.echo(f"etcd: cleared /paddlecloud/{namespace}/{name}/ ({cleared[0]} keys)")
    else:
        click.echo("etcd: no endpoints known; pass --etcd-endpoints to clear the job's keys")
