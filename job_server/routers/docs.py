"""`/docs`: Swagger UI from assets shipped in the package, never from a CDN.

FastAPI's own `/docs` loads Swagger UI's script and stylesheet from jsDelivr and its
favicon from fastapi.tiangolo.com, so in a cluster without internet access it is a
blank page (issue 34, finding 6). Here the same page loads `swagger-ui-dist`'s files
from `job_server/static/swagger-ui/` (version and licence in its README.md), served
by name from a fixed list, and Swagger UI's online validator badge (a request to
validator.swagger.io) is off. ReDoc, which also loads from a CDN, is not served.

The page is the server's own: a Content-Security-Policy lets it run its shipped script and
its one inline script (by its hash) only, talk to this server only, and never be framed;
`X-Frame-Options: DENY` besides.

What this does NOT guarantee: that the shipped Swagger UI is the newest (update it as
its README.md says).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import logging
import re

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

logger = logging.getLogger(__name__)

router = APIRouter(include_in_schema=False)

ASSETS = "/docs/assets"
MEDIA_TYPES = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8",
               "swagger-ui.css": "text/css; charset=utf-8",
               "favicon-32x32.png": "image/png"}


_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def docs_policy(page: str) -> str:
    """The policy of the docs page `page`: its inline scripts allowed by their hashes, nothing
    else inline (Swagger UI sets styles from its script, which CSP does not stop)."""
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(m.encode()).digest()).decode()}'"
                      for m in _INLINE_SCRIPT.findall(page))
    return (f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI over this server's /openapi.json, its files from this server."""
    page = get_swagger_ui_html(
        openapi_url=request.app.openapi_url, title=f"{request.app.title} - API",
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        swagger_ui_parameters={"validatorUrl": None})
    page.headers["Content-Security-Policy"] = docs_policy(page.body.decode())
    page.headers["X-Frame-Options"] = "DENY"
    return page


@router.get(ASSETS + "/{name}")
def swagger_asset(name: str) -> Response:
    """One of Swagger UI's shipped files (a fixed list: nothing else of the package)."""
    media_type = MEDIA_TYPES.get(name)
    if media_type is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no asset {name[:64]!r}")
    data = (importlib.resources.files("job_server") / "static" / "swagger-ui" / name).read_bytes()
    return Response(data, media_type=media_type, headers={"Cache-Control": "public, max-age=86400"})
