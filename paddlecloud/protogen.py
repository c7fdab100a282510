"""Regenerates the gRPC Python code from `proto/`: `python -m paddlecloud.protogen`.

The generated modules live in `paddlecloud/master/v1/`, matching the proto package
`paddlecloud.master.v1`, so the generated imports resolve inside this distribution.
`tests/test_protogen.py` regenerates into a temporary folder and fails when the
committed code differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
PROTO_FILES = ["paddlecloud/master/v1/master.proto"]
GENERATED = ["master_pb2.py", "master_pb2.pyi", "master_pb2_grpc.py"]


def generate(out_dir: Path) -> None:
    """Writes the generated modules under `out_dir/paddlecloud/master/v1/`."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTO_FILES,
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed: {' '.join(args)}")


def main() -> None:
    generate(REPO)
    print(f"regenerated {', '.join(GENERATED)} in {REPO / 'paddlecloud/master/v1'}", file=sys.stderr)


if __name__ == "__main__":
    main()
