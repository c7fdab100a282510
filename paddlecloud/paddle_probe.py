"""Whether a PaddlePaddle can run a parameter-server job: the probe, and the refusal it leads to.

PaddlePaddle removed the parameter-server core from its wheels in 3.1.1 (the WITH_PSCORE build
options; 3.1.0 has only part of it), so a fleet PS program on such a Paddle fails deep inside
`fleet.init` or at its first pull. `is_compiled_with_distribute()` is True there all the same; the
reliable test is the core's `DistFleetWrapper` class. `PROBE` is a Python program that prints
what it finds as one JSON line; `refusal()` turns that into the error a PS job is refused with,
before anything starts, naming the version and the fix.

Where paddlecloud sees the Paddle, it probes it: `paddlecloud local train --pservers N` runs the
probe with the Python that runs the user's module (`--python`) when that module imports Paddle,
and in the image (`--image`). An image it cannot see (a cluster's) is the user's to check: the
docs (docs/kubernetes.md) say which versions run PS jobs.

What this does NOT do: check that a PS-capable Paddle's protobuf and numpy are the ones it needs
(Paddle 2.6.2 wants `numpy<2` and `protobuf>=4.21,<5`; the probe's import fails otherwise, and the
refusal quotes that error).
"""

from __future__ import annotations

import json
import re

PS_FIX = ('use a PaddlePaddle with the parameter-server core: pip install "paddlepaddle==2.6.2" '
          '"numpy<2" "protobuf>=4.21,<5" (in a venv of its own, given with --python, or in the image)')

PROBE = r"""
import json, sys
try:
    import paddle
except Exception as error:
    print(json.dumps({"paddle": None, "error": f"{type(error).__name__}: {error}"[:300]}))
    sys.exit(0)
base = getattr(paddle, "base", None) or getattr(paddle, "fluid", None)
core = getattr(base, "core", None)
print(json.dumps({"paddle": paddle.__version__, "ps_core": hasattr(core, "DistFleetWrapper")}))
"""

_IMPORTS_PADDLE = re.compile(r"^\s*(import\s+paddle\b|from\s+paddle\b)", re.MULTILINE)


def imports_paddle(source: str) -> bool:
    """Whether a module's source imports PaddlePaddle (a PS job that does not — a program of its
    own pservers — is not Paddle's fleet PS, and is not probed)."""
    return bool(_IMPORTS_PADDLE.search(source))


def refusal(output: str, *, where: str, required: bool) -> str | None:
    """The error a PS job is refused with, from `PROBE`'s output run `where` (e.g. "--python
    /usr/bin/python3"); None when that Paddle has the PS core, or when there is no Paddle there
    and none is `required` (an image whose program may not be Paddle's)."""
    line = next((text for text in reversed(output.strip().splitlines()) if text.startswith("{")), "")
    try:
        found = json.loads(line)
    except ValueError:
        return f"could not probe the PaddlePaddle of {where}: it printed {output.strip()[:200]!r}"
    version = found.get("paddle")
    if version is None:
        if not required:
            return None
        return f"the module imports paddle, but {where} cannot: {found.get('error')}; {PS_FIX}"
    if found.get("ps_core"):
        return None
    return (f"PaddlePaddle {version} ({where}) has no parameter-server core (PaddlePaddle removed it "
            f"from its wheels in 3.1.1): a --pservers job cannot run on it; {PS_FIX}")
