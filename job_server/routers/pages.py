"""The browser's pages: `/`, every job the caller's token may see, and each job's status
page proxied from its master at `/v1/namespaces/{namespace}/jobs/{name}/page/{path}`.

The namespace is in the path, not in `?namespace=` as in the JSON API: the master's page
fetches `api/job` and `static/page.js` by relative URL, which keeps the path and drops the
query. A browser sends no bearer header on a navigation, so these routes also read the
token from a cookie: `?token=` given once sets it (HttpOnly, SameSite=Strict, Secure over
https or with `behind_tls_proxy`) and answers a redirect to the same URL without the token (job_server.auth). A job
outside the token's namespaces answers 404, as a job that does not exist does: names do
not leak. The master's answers come through with the job's viewer token, which the
browser never sees (job_server.master_pages).

Headers: the overview sends a strict Content-Security-Policy of its own (no script) and
`X-Frame-Options: DENY`; a proxied page keeps the master's security headers and gets the Job
Server's policy beside them (`proxied_policy`), so a master its submitter controls cannot
serve script that reaches beyond its own page. One master answering nonsense is that job's
"-" in the overview (`job_server.master_pages`), not an error of the page.

These routes are not in the OpenAPI document: they are HTML for a person, not the API.

What this does NOT guarantee: the overview's progress for a job whose master does not
answer within `OVERVIEW_TIMEOUT_S` (shown as "-"); a live overview (it reloads itself
every `REFRESH_S`; each job's own page updates every second).
"""

from __future__ import annotations

import asyncio
import html
import importlib.resources
import logging
import re
import time
from string import Template
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials

from job_server.auth import TOKEN_COOKIE, Principal, bearer, namespaces_of, page_principal
from job_server.master_pages import MasterUnreachable, allowed
from job_server.routers.jobs import JOB_NAME, NAMESPACE
from paddlecloud import pagestyle
from paddlecloud.backends.k8s.jobs import JobCreateError
from paddlecloud.epoch_text import epoch_of
from paddlecloud.jobspec import MAX_NAME_LENGTH

logger = logging.getLogger(__name__)

router = APIRouter(include_in_schema=False)

REFRESH_S = 10            # the overview reloads itself this often
OVERVIEW_TIMEOUT_S = 2.0  # a master's answer for the overview's progress
NO_STORE = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer"}
# The overview: its own stylesheet and nothing else (no script at all; its progress bars'
# widths are inline style attributes, which run nothing), never in a frame.
OVERVIEW_POLICY = ("default-src 'none'; style-src 'self'; style-src-attr 'unsafe-inline'; img-src 'self'; "
                   "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
OWN_PAGE = {**NO_STORE, "Content-Security-Policy": OVERVIEW_POLICY, "X-Frame-Options": "DENY"}


def proxied_policy(page: str) -> str:
    """The Job Server's policy on a job's proxied page at `page` (host and path, ending in '/'),
    sent beside the master's own (a browser enforces both). A master is its submitter's: its
    page may load script, style and data from its own page path only, so whatever it serves
    cannot reach the Job Server's other pages or API from the viewer's browser."""
    return (f"default-src 'none'; script-src {page}static/; style-src {page}static/; "
            f"img-src {page}static/; connect-src {page}; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")


def page_url(namespace: str, name: str) -> str:
    """Where the Job Server serves a job's status page (the trailing slash matters)."""
    return f"/v1/namespaces/{quote(namespace)}/jobs/{quote(name)}/page/"


async def _caller(request: Request) -> Principal | Response:
    """The caller, or the answer to `?token=`: the cookie set and the same URL without it."""
    given = request.query_params.get("token")
    if given is not None:
        if namespaces_of(request, given) is None:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "unknown token",
                                headers={"WWW-Authenticate": "Bearer"})
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
        answer = RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER, headers=NO_STORE)
        answer.set_cookie(TOKEN_COOKIE, given, httponly=True, samesite="strict", path="/",
                          secure=request.url.scheme == "https"
                          or request.app.state.config.behind_tls_proxy)
        return answer
    credentials: HTTPAuthorizationCredentials | None = await bearer(request)
    return page_principal(request, credentials)


# ---- the overview -----------------------------------------------------------------------------


def _progress_cells(progress: dict[str, Any] | None) -> str:
    if progress is None or not progress["tasks"]:
        return '<td class="muted">-</td><td class="muted">-</td><td class="muted">-</td>'
    done = 100 * progress["tasks_done"] / progress["tasks"]
    bar = (f'<div class="bar" title="{progress["tasks_done"]} of {progress["tasks"]} tasks done '
           f'this epoch"><span class="done" style="width:{done:.1f}%"></span>'
           f'<span class="todo" style="width:{100 - done:.1f}%"></span></div>')
    epoch = epoch_of(progress["epoch"], progress["epochs"]).removeprefix("epoch ")
    return (f'<td data-field="epoch">{epoch}</td>'
            f'<td data-field="tasks"><span data-field="tasks-done">{progress["tasks_done"]}</span>'
            f' / {progress["tasks"]} {bar}</td>'
            f'<td data-field="alive">{progress["trainers_alive"]}</td>')


def _row(job: dict[str, Any], progress: dict[str, Any] | None) -> str:
    e = html.escape
    namespace, name, phase = job["namespace"], job["name"], job["phase"]
    return (f'<tr data-job="{e(namespace)}/{e(name)}"><td>{e(namespace)}</td>'
            f'<td><a href="{e(page_url(namespace, name)[1:])}">{e(name)}</a></td>'
            f'<td><span class="phase {e(phase)}" data-field="phase">{e(phase)}</span></td>'
            f'{_progress_cells(progress)}<td>{e(job["created"])}</td></tr>')


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request) -> Response:
    """Every job of the token's namespaces: phase, epoch and tasks, a link to its page."""
    caller = await _caller(request)
    if isinstance(caller, Response):
        return caller
    state = request.app.state
    listed = await asyncio.gather(*(asyncio.to_thread(state.cluster.list, ns) for ns in caller.namespaces),
                                  return_exceptions=True)
    jobs: list[dict[str, Any]] = []
    failures = []
    for namespace, found in zip(caller.namespaces, listed, strict=True):
        if isinstance(found, JobCreateError):
            failures.append(f"namespace {namespace}: {found}")
        elif isinstance(found, BaseException):
            raise found
        else:
            jobs.extend(found)
    progress = await asyncio.gather(*(state.master_pages.progress(j["namespace"], j["name"],
                                                                   timeout=OVERVIEW_TIMEOUT_S)
                                      for j in jobs))
    template = Template((importlib.resources.files("job_server") / "static" / "overview.html")
                        .read_text(encoding="utf-8"))
    page = template.substitute(
        refresh=REFRESH_S, count=len(jobs), updated=time.strftime("%H:%M:%S"),
        namespaces=html.escape(", ".join(caller.namespaces)),
        failures="".join(f'<div class="failure">{html.escape(f)}</div>' for f in failures),
        rows="".join(_row(j, p) for j, p in zip(jobs, progress, strict=True))
        or '<tr><td colspan="7" class="muted">no jobs</td></tr>')
    return HTMLResponse(page, headers=OWN_PAGE)


@router.get("/static/page.css")
async def stylesheet() -> Response:
    """The stylesheet both pages use (`paddlecloud.pagestyle`)."""
    return Response(pagestyle.stylesheet(), media_type=pagestyle.MEDIA_TYPE,
                    headers={"Cache-Control": pagestyle.CACHE_CONTROL})


# ---- a job's page, from its master --------------------------------------------------------------


def _not_found(name: str, namespace: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND,
                         f"job {name[:MAX_NAME_LENGTH]} not found in namespace {namespace[:63]}")


@router.get("/v1/namespaces/{namespace}/jobs/{name}/page")
async def job_page_root(request: Request, namespace: str, name: str) -> Response:
    """The page needs its trailing slash: its URLs are relative to it."""
    target = page_url(namespace, name) + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(target, status_code=status.HTTP_308_PERMANENT_REDIRECT)


@router.get("/v1/namespaces/{namespace}/jobs/{name}/page/{path:path}")
async def job_page(request: Request, namespace: str, name: str, path: str) -> Response:
    """The job's status page and its JSON, from its master, as its viewer sees them."""
    caller = await _caller(request)
    if isinstance(caller, Response):
        return caller
    if not allowed(path):
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            f"{path[:40]!r} is not a path of the status page: "
                            "'', api/job, api/series, api/schema, static/FILE")
    if (namespace not in caller.namespaces or not re.fullmatch(NAMESPACE, namespace)
            or len(name) > MAX_NAME_LENGTH or not re.fullmatch(JOB_NAME, name)):
        raise _not_found(name, namespace)  # as for a job that does not exist: no name leaks
    try:
        answer = await request.app.state.master_pages.get(namespace, name, path)
    except JobCreateError as error:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, f"the Kubernetes API: {error}") from None
    except MasterUnreachable as error:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, str(error)) from None
    if answer is None:
        raise _not_found(name, namespace)
    if answer.status in (401, 403):
        raise HTTPException(status.HTTP_502_BAD_GATEWAY,
                            f"the master of {namespace}/{name} refused the job's viewer token")
    own = request.url.netloc + page_url(namespace, name)  # no scheme: the page's own (behind a TLS proxy too)
    response = Response(answer.body, status_code=answer.status, headers={**answer.headers, **NO_STORE,
                                                                         "X-Frame-Options": "DENY"})
    response.headers.append("Content-Security-Policy", proxied_policy(own))
    return response
