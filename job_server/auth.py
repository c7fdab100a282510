"""Bearer tokens, each mapped to the namespaces it may use: one FastAPI dependency.

`principal` answers 401 for a missing or unknown token before any route code runs;
`Principal.namespace` answers 403 for a namespace the token may not use, so a
token of one namespace sees, reads and deletes nothing of another.

The browser pages (`/` and the proxied job pages, job_server.routers.pages) take the
same token in a cookie too: a navigation carries no header. `?token=` given once sets
it (HttpOnly, SameSite=Strict) and the page reloads without it (`page_principal`). Only
those read-only GET routes read the cookie: every other route wants the header, so no
cross-site form can act with a visitor's cookie.

What this does NOT guarantee: anything about who holds a token; tokens travel in
clear unless the server is behind TLS (an Ingress, or uvicorn's --ssl-*).
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

logger = logging.getLogger(__name__)

bearer = HTTPBearer(auto_error=False, description="A token from the server's tokens file.")


@dataclass(frozen=True)
class Principal:
    """The caller: the namespaces its token may use (the first is its default)."""

    namespaces: tuple[str, ...]

    def namespace(self, requested: str | None) -> str:
        """The namespace a request acts in; 403 when the token may not use it."""
        namespace = requested or self.namespaces[0]
        if namespace not in self.namespaces:
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                f"this token may not use namespace {namespace[:63]!r}")
        return namespace


TOKEN_COOKIE = "paddlecloud_token"  # the browser pages' copy of the bearer token
UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


def namespaces_of(request: Request, given: str) -> tuple[str, ...] | None:
    """The namespaces of a token of the server's tokens file; None for an unknown token."""
    found: tuple[str, ...] | None = None
    for token, namespaces in request.app.state.config.tokens.items():
        if hmac.compare_digest(token.encode(), given.encode()):  # every token compared: no timing hint
            found = namespaces
    return found


def principal(request: Request, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
    """The caller of a request, from its `Authorization: Bearer TOKEN` header."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                            "missing token: send Authorization: Bearer TOKEN", headers=UNAUTHORIZED)
    found = namespaces_of(request, credentials.credentials)
    if found is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "unknown token", headers=UNAUTHORIZED)
    return Principal(found)


def page_principal(request: Request, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
    """The caller of a browser page: the bearer header's token, else the cookie's."""
    if credentials is not None:
        return principal(request, credentials)
    given = request.cookies.get(TOKEN_COOKIE)
    found = namespaces_of(request, given) if given else None
    if found is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                            "no valid token: open this page once with ?token=TOKEN (a Job Server "
                            "token), or send Authorization: Bearer TOKEN", headers=UNAUTHORIZED)
    return Principal(found)


Caller = Annotated[Principal, Depends(principal)]
