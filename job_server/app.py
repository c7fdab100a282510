"""The FastAPI application: routers, configuration, store and cluster in `app.state`.

`/` and the jobs' proxied status pages are HTML for a browser (job_server.routers.pages),
left out of the OpenAPI document. `/openapi.json` is served by the app itself; `/docs` is
Swagger UI from files shipped in the package (job_server.routers.docs), so it works
without internet access.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, HTTPException, status
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from job_server.cluster import Cluster
from job_server.config import MULTIPART_SLACK, ServerConfig
from job_server.master_pages import MasterPages, PageAddress, service_page_address
from job_server.packages import PackageStore
from job_server.routers import docs, jobs, packages, pages, version

logger = logging.getLogger(__name__)




class BodyLimit:
    """Refuses (413) a request body over the limit while it streams in, so a body sent
    without Content-Length (chunked) is not spooled whole before the route's checks."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                                        f"the request body is over {self.limit} bytes "
                                        "(max_upload_bytes and the multipart frame)")
            return message

        await self.app(scope, limited, send)


def create_app(config: ServerConfig, *, api_client: Any,
               page_address: PageAddress = service_page_address) -> FastAPI:
    """The server, talking to the cluster through `api_client` (a kubernetes ApiClient) and
    to the masters' status pages at `page_address(namespace, name)` (host:port)."""
    app = FastAPI(title="paddlecloud Job Server", version="1", docs_url=None, redoc_url=None,
                  description="Upload trainer packages and run paddlecloud jobs (DESIGN.md §11).")
    app.state.config = config
    app.state.store = PackageStore(config.store)
    app.state.cluster = Cluster(api_client, build=config.build, paddlejobs=config.paddlejobs,
                                paddlecloud_image=config.paddlecloud_image)
    app.state.master_pages = MasterPages(read_viewer_token=app.state.cluster.viewer_token,
                                         address=page_address)
    for router in (packages.router, jobs.router, version.router, pages.router, docs.router):
        app.include_router(router)
    app.add_middleware(BodyLimit, limit=config.limits.max_upload_bytes + MULTIPART_SLACK)
    return app
