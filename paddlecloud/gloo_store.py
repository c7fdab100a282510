"""The gloo rendezvous store of a PS job's trainers, served by paddlecloud for the job's whole life.

With `PADDLE_WITH_GLOO=1` and `PADDLE_GLOO_RENDEZVOUS=3`, Paddle's fleet (2.6.2,
`paddle/distributed/fleet/base/role_maker.py`) joins the trainers in one gloo world at
`fleet.init`: each trainer's `core.Gloo` puts the addresses of its pairs in an HTTP key-value
store at `PADDLE_GLOO_HTTP_ENDPOINT` and reads its peers' (gloo's full-mesh rendezvous), and
`fleet.util.barrier()` (`fleet.init_worker`, `save_persistables`, `load_model`) then runs
over that world. Paddle has pserver 0 serve the store (`KVServer`, in a child process) only
until every trainer has finished its first rendezvous: a trainer started again later polls
the closed port for ever in `fleet.init` (`wait_server_ready`). So paddlecloud serves it
instead, before any pserver starts and until the job ends; pserver 0's own server then
cannot bind the port (it is taken: Linux refuses a second listener even with SO_REUSEADDR),
its child process exits, and pserver 0 goes on (it only waits for that process).

The protocol is the one Paddle's store client speaks (gloo's `HTTPStore`, as `KVHandler`
answers it): `PUT /SCOPE/KEY` stores the body, `GET /SCOPE/KEY` answers it or 404 (the client
polls until the key is there), `DELETE /SCOPE/KEY` is a rank saying it finished its
rendezvous. A DELETE keeps the value: a slower peer may still have to read it.

What this does NOT do: let a restarted trainer into the old world. Gloo's world is fixed
when it is made (every rank rendezvouses once, together), so the deployer restarts the
whole trainer group and calls `reset()` between the two: the new group must not read the
old one's addresses.
"""

from __future__ import annotations

import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

logger = logging.getLogger(__name__)

MAX_VALUE_BYTES = 1 << 20  # a rank's value is its pairs' addresses: ~136 bytes per peer


class _Handler(BaseHTTPRequestHandler):
    server: _StoreServer

    def _scope_key(self) -> tuple[str, str] | None:
        parts = self.path.split("/")
        if len(parts) != 3 or parts[0] or not parts[1] or not parts[2]:
            self._answer(HTTPStatus.BAD_REQUEST, f"not /SCOPE/KEY: {self.path[:80]!r}\n".encode())
            return None
        return parts[1], parts[2]

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if (where := self._scope_key()) is None:
            return
        with self.server.lock:
            value = self.server.values.get(where)
        if value is None:
            self._answer(HTTPStatus.NOT_FOUND)
        else:
            self._answer(HTTPStatus.OK, value)

    def do_PUT(self) -> None:  # noqa: N802
        if (where := self._scope_key()) is None:
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_VALUE_BYTES:
            self._answer(HTTPStatus.BAD_REQUEST,
                         f"Content-Length {self.headers.get('Content-Length')!r:.30}: need 0.."
                         f"{MAX_VALUE_BYTES}\n".encode())
            return
        value = self.rfile.read(length)
        with self.server.lock:
            self.server.values[where] = value
        self._answer(HTTPStatus.OK)

    def do_DELETE(self) -> None:  # noqa: N802
        if (where := self._scope_key()) is None:
            return
        with self.server.lock:
            self.server.finished.setdefault(where[0], set()).add(where[1])
        self._answer(HTTPStatus.OK)

    def _answer(self, status: HTTPStatus, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        logger.debug("gloo store: " + format, *args)


class _StoreServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.lock = threading.Lock()
        self.values: dict[tuple[str, str], bytes] = {}
        self.finished: dict[str, set[str]] = {}


class GlooStore:
    """The HTTP store of one job's gloo rendezvous, on loopback (`port` 0: a free one).

        store = GlooStore().start()
        env["PADDLE_GLOO_HTTP_ENDPOINT"] = store.endpoint
        ...
        store.reset()      # between two trainer groups
        store.close()
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        if not 0 <= port < 65536:
            raise ValueError(f"gloo store port {port}: need 0..65535 (0: a free one)")
        self._server = _StoreServer((host, port))
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def start(self) -> GlooStore:
        self._thread = threading.Thread(target=self._server.serve_forever, name="gloo-store",
                                        daemon=True)
        self._thread.start()
        return self

    def reset(self) -> None:
        """Forgets every key: the next rendezvous starts from nothing."""
        with self._server.lock:
            self._server.values.clear()
            self._server.finished.clear()

    def finished(self, scope: str) -> int:
        """How many ranks of `scope` said they finished their rendezvous (since the last reset)."""
        with self._server.lock:
            return len(self._server.finished.get(scope, ()))

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> GlooStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
