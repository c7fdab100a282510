"""etcd endpoints as flags and the environment give them: `http://HOST:PORT,...` (plaintext)
or `https://HOST:PORT,...` (TLS, with `paddlecloud.etcd.credentials.EtcdCredentials`)."""

from __future__ import annotations

from urllib.parse import urlsplit


def uses_tls(text: str) -> bool:
    """Whether the endpoints are `https://` (all of them; a mix is refused by parse_endpoints)."""
    return any(p.strip().startswith("https://") for p in text.split(","))


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """`http://10.0.0.1:2379,127.0.0.1:2379` -> [(host, port), ...]; errors name the bad part.

    `https://` endpoints are TLS (see `EtcdCredentials`); all endpoints share one scheme."""
    endpoints = []
    schemes = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        url = urlsplit(part if "://" in part else f"http://{part}")
        if url.scheme not in ("http", "https", "") or not url.hostname:
            raise ValueError(
                f"invalid etcd endpoint {part[:100]!r}: expected http://HOST:PORT or https://HOST:PORT"
            )
        schemes.add(url.scheme)
        if len(schemes) > 1:
            raise ValueError(f"etcd endpoints {text[:200]!r} mix http:// and https://: use one scheme")
        try:
            port = url.port or 2379
        except ValueError:
            raise ValueError(f"invalid etcd endpoint {part[:100]!r}: bad port") from None
        endpoints.append((url.hostname, port))
    if not endpoints:
        raise ValueError(f"no etcd endpoint in {text[:200]!r}")
    return endpoints
