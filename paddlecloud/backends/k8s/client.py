"""The Kubernetes API client as every paddlecloud caller uses it: credentials, retries, errors.

`load_api_client` finds credentials (a kubeconfig, else in-cluster, else
~/.kube/config); `call` (asyncio, the call runs in a thread) and `call_sync` (the CLI)
retry answers that may pass — 429, 500, 502, 503, 504, a broken connection — with
exponential backoff a bounded number of times; `explained` turns what the API said
into one clear error naming the verb, the resource, the namespace and, for a 403,
where the caller's rights come from. The master's deployer and `paddlecloud job`
share all of it.

What this does NOT guarantee: that a retried call is safe — the caller decides (a
create whose first try went through answers 409 on the retry; gets, merge patches
and deletes are idempotent) —, nor any timeout beyond the client's own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import tenacity

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})

# Server-side apply (docs/kubernetes.md, "Server-side apply"): every change paddlecloud makes
# to an object is an apply naming its component's field manager; creates name it too.
APPLY_PATCH = "application/apply-patch+yaml"
MASTER_MANAGER = "paddlecloud-master"
OPERATOR_MANAGER = "paddlecloud-operator"
CLI_MANAGER = "paddlecloud-cli"
# a user's labels and annotations carried over into a Job the master made again (a group
# restart): applied by a manager of their own, so the master's later applies, which never
# state them, leave them be
KEPT_USER_FIELDS_MANAGER = "paddlecloud-kept-user-fields"


class KubernetesApiError(RuntimeError):
    """The API server refused or failed a call; the message says which and why.

    `status` is the HTTP status, 0 when the API server could not be reached.
    """

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status

    @property
    def transient(self) -> bool:
        """Another try later may pass: unreachable, throttled or a server error."""
        return self.status == 0 or self.status in RETRYABLE_STATUS


class KubernetesPermissionError(KubernetesApiError):
    """403: the caller's RBAC lacks a verb on a resource."""


class KubernetesConflictError(KubernetesApiError):
    """409 on an object that belongs to something else."""


@dataclass(frozen=True)
class RetryPolicy:
    """How transient API failures are retried: `attempts` tries in all, exponential waits."""

    attempts: int = 5
    """Tries in all, the first included."""
    initial_wait: float = 0.5
    """Seconds before the second try; each next wait doubles..."""
    max_wait: float = 8.0
    """...up to this many seconds."""
    request_timeout: tuple[float, float] = (10.0, 60.0)
    """Seconds to connect, and to wait for the answer's next bytes: an API server that stalls
    fails the try (a transient error: the next try goes) instead of holding its thread for
    ever, and the master's stop, which waits for its threads, with it."""

    def tenacity_kwargs(self) -> dict[str, Any]:
        """The arguments of a `tenacity.Retrying` that retries transient errors per this policy."""
        return {
            "stop": tenacity.stop_after_attempt(self.attempts),
            "wait": tenacity.wait_exponential(multiplier=self.initial_wait, min=self.initial_wait,
                                              max=self.max_wait),
            "retry": tenacity.retry_if_exception(is_transient),
            "before_sleep": _before_sleep,
            "reraise": True,
        }

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts={self.attempts}: must be >= 1")
        if self.initial_wait < 0 or self.max_wait < self.initial_wait:
            raise ValueError(
                f"RetryPolicy waits {self.initial_wait}..{self.max_wait}: need 0 <= initial <= max"
            )


def applied(manager: str, *, force: bool = False) -> dict[str, Any]:
    """The keyword arguments that make a client `patch_*` call a server-side apply by
    `manager`. `force` takes the fields over from another manager: only for fields the
    component owns (docs/kubernetes.md lists them); without it a field another manager set
    to another value is a 409 naming that manager (`explain`: a `KubernetesConflictError`)."""
    return {"_content_type": APPLY_PATCH, "field_manager": manager, "force": force}


def apply_body(obj: dict[str, Any], *, api_version: str, kind: str, name: str,
               namespace: str | None = None) -> dict[str, Any]:
    """An apply's body: the object's identity and the fields the manager sets, all of them
    (an apply leaves out nothing its manager means to keep: what it set before and omits now
    is removed)."""
    meta = {"name": name, **({"namespace": namespace} if namespace else {}),
            **(obj.pop("metadata", None) or {})}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **obj}


def api_status(error: BaseException) -> int | None:
    """The HTTP status of a client error, None when it is not an API answer."""
    from kubernetes.client.exceptions import ApiException

    return error.status if isinstance(error, ApiException) else None


def api_message(error: BaseException) -> str:
    """The API server's own words (the Status `message`), else the error's text."""
    body = getattr(error, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
            if message:
                return str(message)
        except (ValueError, AttributeError):
            pass
    reason = getattr(error, "reason", None)
    return str(reason or error).strip()


def is_transient(error: BaseException) -> bool:
    """Worth another try: throttling, a server error, or a broken connection."""
    import urllib3

    status = api_status(error)
    if status is not None:
        return status in RETRYABLE_STATUS
    return isinstance(error, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


def explain(error: BaseException, *, verb: str, resource: str, namespace: str,
            name: str = "", rights: str | None = None) -> KubernetesApiError:
    """A clear error for a failed call: what was tried, what the API said, what to do.

    `rights` says where the caller's rights come from (default: the master's Role).
    """
    status = api_status(error) or 0
    what = f"{verb} {resource}{' ' + name if name else ''} in namespace {namespace}"
    if status == 403:
        rights = rights or (
            "The master's rights come from its job's own Role JOB-master, made at submit "
            "(paddlecloud.backends.k8s.manifests.master_rules)"
        )
        # an apply is a patch, and also a create where the object is absent (RBAC's verbs)
        lacks = "'patch' (and 'create', for a new object)" if verb == "apply" else f"'{verb}'"
        return KubernetesPermissionError(
            f"forbidden to {what}: the account lacks {lacks} on '{resource}'. {rights}; "
            f"the API said: {api_message(error)}",
            status=403,
        )
    if status == 0:
        return KubernetesApiError(f"cannot {what}: the API server is unreachable ({error})")
    if status == 409 and verb == "apply":
        return KubernetesConflictError(
            f"cannot {what}: another field manager owns a field paddlecloud would change, and "
            "paddlecloud forces only the fields it owns (docs/kubernetes.md, 'Server-side "
            f"apply'): {api_message(error)}", status=409)
    return KubernetesApiError(
        f"cannot {what}: the API answered {status}: {api_message(error)}", status=status
    )


def explained(error: Exception, *, verb: str, resource: str, namespace: str, name: str = "",
              rights: str | None = None) -> Exception:
    """The error to raise for a failed call: API answers and lost connections explained
    (`explain`), anything else — a bug — as it is."""
    if api_status(error) is None and not is_transient(error):
        return error
    return explain(error, verb=verb, resource=resource, namespace=namespace, name=name,
                   rights=rights)


def _before_sleep(state: tenacity.RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    logger.warning("Kubernetes API call failed (%s), try %d; retrying",
                   api_status(error) or error, state.attempt_number)


def call_sync(policy: RetryPolicy, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """A blocking client call (a method of the Kubernetes client's APIs), retried per `policy`,
    each try within its request timeout (for the CLI)."""
    kwargs.setdefault("_request_timeout", policy.request_timeout)
    for attempt in tenacity.Retrying(**policy.tenacity_kwargs()):
        with attempt:
            return fn(*args, **kwargs)
    raise AssertionError("unreachable")  # pragma: no cover


async def call(policy: RetryPolicy, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`call_sync`'s call run in a thread (for the master and the operator)."""
    kwargs.setdefault("_request_timeout", policy.request_timeout)
    async for attempt in tenacity.AsyncRetrying(**policy.tenacity_kwargs()):
        with attempt:
            return await asyncio.to_thread(fn, *args, **kwargs)
    raise AssertionError("unreachable")  # pragma: no cover


def load_api_client(kubeconfig: str | None = None) -> Any:
    """An `ApiClient`: `kubeconfig` if given, else in-cluster, else ~/.kube/config ($KUBECONFIG).

    Its connections make one try each: `RetryPolicy` is the one retry policy (urllib3's own
    retries of a read would multiply each try's request timeout by four, unseen)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            try:
                config.load_kube_config(client_configuration=configuration)
            except (config.ConfigException, FileNotFoundError) as error:
                raise KubernetesApiError(
                    f"no Kubernetes configuration: not in a cluster and no kubeconfig ({error}); "
                    "pass --kubeconfig or set KUBECONFIG"
                ) from None
    configuration.retries = False
    return client.ApiClient(configuration)
