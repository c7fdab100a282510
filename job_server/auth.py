"""Bearer tokens, each mapped to the namespaces it may use: one FastAPI dependency.

`principal` answers 401 for a missing or unknown token before any route code runs;
`Principal.namespace` answers 403 for a namespace the token may not use, so a
token of one namespace sees, reads and deletes nothing of another.

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


def principal(request: Request, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
    """The caller of a request, from its `Authorization: Bearer TOKEN` header."""
    unauthorized = {"WWW-Authenticate": "Bearer"}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                            "missing token: send Authorization: Bearer TOKEN", headers=unauthorized)
    given = credentials.credentials.encode()
    found: tuple[str, ...] | None = None
    for token, namespaces in request.app.state.config.tokens.items():
        if hmac.compare_digest(token.encode(), given):  # every token compared: no timing hint
            found = namespaces
    if found is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "unknown token", headers=unauthorized)
    return Principal(found)


Caller = Annotated[Principal, Depends(principal)]
