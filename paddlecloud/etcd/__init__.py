"""etcd plumbing shared by the master, the agents and the CLI, on top of `aetcd`, split by job
as etcd's Go `concurrency` package is:

* `client`: `connect()` finds a live endpoint, or fails fast naming every endpoint it tried;
* `aetcd_client`: aetcd's client on our own channel (TLS) with a renewed auth token, the one
  module that leans on aetcd's internals;
* `credentials`, `endpoints`, `errors`: who we are to etcd (and where a password may go),
  where etcd is, and what a call fails with;
* `ranges`: reading a range of many keys in pages;
* `lease`: `LeaseKeeper`, many leases refreshed over one stream;
* `session`: `Session`, a lease plus the keep-alive loop that owns it;
* `election`: `Election` (campaign on one key, observe the leader) and `Leadership` (the fence
  on the won key).

The names below are the package's public ones: `from paddlecloud.etcd import connect`.
"""

from paddlecloud.etcd.client import RECEIVE_ANY_SIZE, RPC_TIMEOUT, connect
from paddlecloud.etcd.credentials import (
    PLAINTEXT_PASSWORD_ENV,
    EtcdCredentials,
    refuse_plaintext_password,
)
from paddlecloud.etcd.election import Election, Leadership
from paddlecloud.etcd.endpoints import parse_endpoints, uses_tls
from paddlecloud.etcd.errors import EtcdAuthError, EtcdUnavailable, is_auth_failure
from paddlecloud.etcd.lease import LeaseKeeper
from paddlecloud.etcd.ranges import read_key_numbers, read_range
from paddlecloud.etcd.session import MIN_LEASE_TTL, Session

__all__ = [
    "MIN_LEASE_TTL", "PLAINTEXT_PASSWORD_ENV", "RECEIVE_ANY_SIZE", "RPC_TIMEOUT", "Election",
    "EtcdAuthError", "EtcdCredentials", "EtcdUnavailable", "Leadership", "LeaseKeeper",
    "Session", "connect", "is_auth_failure", "parse_endpoints", "read_key_numbers",
    "read_range", "refuse_plaintext_password", "uses_tls",
]
