"""The command line of a job's master, built in one place for every backend.

The local backend runs `python -m paddlecloud master FLAGS`, the Kubernetes
manifests run `paddlecloud master FLAGS`; both get FLAGS from `master_flags`, which
renders the settings of `paddlecloud.master_settings` (the table `paddlecloud master`
takes its options from), so a flag renamed there is renamed for both. What this does
NOT do: check values — the master validates its flags and exits 2 on a bad one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from paddlecloud.master_settings import SETTING, SETTINGS


def master_flags(*, extra: Sequence[str] = (), **settings: Any) -> list[str]:
    """The flags after `paddlecloud master`: one keyword per setting, by its name in
    `paddlecloud.master_settings` (`job=`, `inputs=`, `session_ttl=`, `shuffle_seed=`, ...);
    None leaves the master's default, and a switch set False (`insecure=False`) too when it
    has no off flag. The dataset's settings (`epochs=`, `data_format=`, ...) shape the
    dataset of `inputs=` only, so without inputs they are left out. `extra` flags come
    last, as given."""
    unknown = sorted(settings.keys() - SETTING.keys())
    if unknown:
        raise TypeError(f"master_flags: no master setting named {', '.join(unknown)}")
    words = []
    for setting in SETTINGS:
        if setting.part == "dataset" and not settings.get("inputs"):
            continue
        words += setting.argv(settings.get(setting.name))
    return [*words, *extra]
