"""The masters' status pages, as the Job Server reaches them: through each job's Service,
with the job's viewer token.

A browser outside the cluster has no route to a master, and must never hold a master
token. The Job Server reads the job's viewer token from its Secret `NAME-tokens` (made by
`paddlecloud.backends.k8s.jobs.create_job`; the Job Server's Role has `get` on secrets for it),
keeps it in memory, and asks the master's HTTP port (the Service's `metrics` port) for a
page path of `ALLOWED` only. A viewer token opens no session ids (master.web).

A master's answer is not trusted: one that is no JSON object shows that job as unreachable
in the overview (`progress` None), not an error of the whole page.

What this does NOT guarantee: a page for a job whose master is not reachable from the
Job Server (a NetworkPolicy that admits the status port only from the job's own
namespace keeps a Job Server of another namespace out: `MasterUnreachable`); a cached
token is dropped and read again once the master refuses it (a job made anew under the
same name has new tokens) or does not answer (the job may be gone), not sooner.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from paddlecloud.backends.k8s import manifests
from paddlecloud.backends.k8s.jobs import JobCreateError

logger = logging.getLogger(__name__)

TIMEOUT_S = 5.0  # a master's answer to one page request
# The page's paths a browser may ask through the Job Server: the shell, its JSON, its code.
# Not /metrics (an operator's scrape, not the page's) and nothing else the master may serve.
ALLOWED = ("", "api/job", "api/series", "api/goodput", "api/schema")
STATIC = re.compile(r"^static/[A-Za-z0-9_-]+\.(?:css|js|svg|png)$")
# Headers of the master's answer passed to the browser; no cookie, nothing else. Its own
# security headers are kept (the Job Server adds a policy of its own beside them: the
# browser enforces both, `job_server.routers.pages`).
PASSED_HEADERS = ("Content-Type", "Cache-Control", "ETag", "Last-Modified", "Content-Security-Policy",
                  "X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy")

# host:port of a job's status page, from (namespace, name): its Service's metrics port.
PageAddress = Callable[[str, str], str]


def service_page_address(namespace: str, name: str) -> str:
    return f"{manifests.master_name(name)}.{namespace}.svc:{manifests.METRICS_PORT}"


def allowed(path: str) -> bool:
    """True for a path of the master's page a browser may ask for (no `..`, no /metrics)."""
    return path in ALLOWED or STATIC.match(path) is not None


class MasterUnreachable(RuntimeError):
    """The job's master did not answer; the message says where it was asked."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: dict[str, str]


class MasterPages:
    """Viewer tokens by job, read from the jobs' Secrets, and the requests to the masters."""

    def __init__(self, *, read_viewer_token: Callable[[str, str], str | None],
                 address: PageAddress = service_page_address) -> None:
        self.read_viewer_token = read_viewer_token  # blocking: the Kubernetes API
        self.address = address
        self._tokens: dict[tuple[str, str], str] = {}

    async def viewer_token(self, namespace: str, name: str, *, fresh: bool = False) -> str | None:
        """The job's viewer token; None when the job has no tokens Secret (no such job)."""
        key = (namespace, name)
        if fresh or key not in self._tokens:
            token = await asyncio.to_thread(self.read_viewer_token, namespace, name)
            if token is None:
                self._tokens.pop(key, None)
                return None
            self._tokens[key] = token
        return self._tokens[key]

    async def get(self, namespace: str, name: str, path: str, *,
                  timeout: float = TIMEOUT_S) -> Answer | None:
        """The master's answer to GET /`path` (one of `allowed`), asked with the viewer token.

        None when the job has no tokens Secret. Raises `MasterUnreachable`."""
        if not allowed(path):
            raise ValueError(f"page path {path[:40]!r} is not one of the status page's")
        for attempt in (0, 1):
            token = await self.viewer_token(namespace, name, fresh=attempt == 1)
            if token is None:
                return None
            answer = await self._ask(namespace, name, path, token=token, timeout=timeout)
            if answer.status != 401:
                return answer
            logger.info("the master of %s/%s refused its viewer token; reading it again", namespace, name)
        return answer

    async def _ask(self, namespace: str, name: str, path: str, *, token: str, timeout: float) -> Answer:
        url = f"http://{self.address(namespace, name)}/{path}"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http, \
                    http.get(url, headers={"Authorization": f"Bearer {token}"},
                             allow_redirects=False) as reply:
                body = await reply.read()
                headers = {h: reply.headers[h] for h in PASSED_HEADERS if h in reply.headers}
                return Answer(status=reply.status, body=body, headers=headers)
        except (aiohttp.ClientError, TimeoutError) as error:
            self._tokens.pop((namespace, name), None)  # read again next time: the job may be gone
            raise MasterUnreachable(f"the status page of {namespace}/{name} at "
                                    f"{self.address(namespace, name)} did not answer: "
                                    f"{type(error).__name__}: {error}"[:300]) from None

    async def progress(self, namespace: str, name: str, *,
                       timeout: float = TIMEOUT_S) -> dict[str, Any] | None:
        """Epoch and task progress from the master's /api/job; None when it does not answer."""
        try:
            answer = await self.get(namespace, name, "api/job", timeout=timeout)
        except (MasterUnreachable, JobCreateError) as error:
            logger.info("%s", error)
            return None
        if answer is None or answer.status != 200:
            return None
        figures = _figures(answer.body)
        if figures is None:  # one master answering nonsense is that job's "-" in the overview, no more
            logger.info("the master of %s/%s answered api/job with no job's figures: %r", namespace, name,
                        answer.body[:80])
        return figures


def _figures(body: bytes) -> dict[str, int] | None:
    """The overview's figures from a master's /api/job; None unless each is a count."""
    try:
        job = json.loads(body)
    except ValueError:
        return None
    counts = job.get("counts") or {} if isinstance(job, dict) else None
    if not isinstance(counts, dict):
        return None
    figures = {"epoch": job.get("epoch", 0), "epochs": job.get("num_epochs", 0),
               "tasks_done": counts.get("done", 0), "tasks": job.get("num_tasks", 0),
               "trainers_alive": job.get("trainers_alive", 0)}
    return figures if all(type(v) is int and v >= 0 for v in figures.values()) else None

