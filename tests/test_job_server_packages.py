"""`POST /v1/package`: hostile archives refused naming the problem, nothing written; one copy per package."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile

import fsspec
import pytest
from fastapi.testclient import TestClient

from job_server.app import create_app
from job_server.config import Limits, ServerConfig

pytestmark = pytest.mark.unit

TOKEN = {"Authorization": "Bearer token-a"}


@pytest.fixture
def store_url(request) -> str:
    url = f"memory://packages-{request.node.name}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


@pytest.fixture
def client(store_url) -> TestClient:
    config = ServerConfig(store=store_url, tokens={"token-a": ("team-a",)},
                          limits=Limits(max_upload_bytes=200_000, max_unpacked_bytes=1_000_000,
                                        max_files=50))
    with TestClient(create_app(config, api_client=None)) as test_client:
        yield test_client


def stored_files(url: str) -> list[str]:
    fs = fsspec.filesystem("memory")
    return fs.find(url) if fs.exists(url) else []


def zip_of(entries: dict[str, bytes], *, symlinks: dict[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return out.getvalue()


def upload(client: TestClient, data: bytes, name: str = "pkg.zip"):
    return client.post("/v1/package", headers=TOKEN, files={"file": (name, data)})


GOOD = {"requirements.txt": b"numpy\n", "fit/__init__.py": b"", "fit/train.py": b"print(1)\n"}


@pytest.mark.parametrize(("entries", "symlinks", "code", "says"), [
    ({**GOOD, "../evil.py": b"x"}, None, 422, "climbs out of the package"),
    ({**GOOD, "/etc/cron.d/evil": b"x"}, None, 422, "absolute path"),
    (GOOD, {"link": "/etc/passwd"}, 422, "symbolic link"),
    ({"requirements.txt": b"", "bomb.bin": b"\0" * 5_000_000}, None, 413, "max_unpacked_bytes"),
    ({"train.py": b"print(1)\n"}, None, 422, "no requirements.txt"),
    ({**GOOD, "a": b"x", "a/b": b"y"}, None, 422, "'a/b' is inside 'a'"),
    ({**GOOD, "a/b": b"y", "a": b"x"}, None, 422, "'a' is both a file and a folder"),
    ({**GOOD, "d/" + "n" * 256: b"x"}, None, 422, "longer than 255 bytes"),
], ids=["dotdot", "absolute", "symlink-out", "zip-bomb", "no-requirements", "file-then-folder",
        "folder-then-file", "long-component"])
def test_hostile_zips_are_refused_naming_the_problem_and_nothing_is_written(
        client, store_url, entries, symlinks, code, says):
    response = upload(client, zip_of(entries, symlinks=symlinks))
    assert response.status_code == code, response.text
    assert says in response.json()["detail"]
    assert stored_files(store_url) == []


def test_a_tar_with_a_device_file_or_a_link_out_is_refused(client, store_url):
    for kind, says in ((tarfile.CHRTYPE, "device"), (tarfile.SYMTYPE, "link")):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:gz") as archive:
            info = tarfile.TarInfo("requirements.txt")
            archive.addfile(info, io.BytesIO(b""))
            special = tarfile.TarInfo("dev")
            special.type, special.linkname = kind, "../../outside"
            archive.addfile(special)
        response = upload(client, out.getvalue(), "pkg.tar.gz")
        assert response.status_code == 422 and says in response.json()["detail"], response.text
    assert stored_files(store_url) == []


def test_an_oversized_body_is_refused_with_the_limit(client, store_url):
    response = upload(client, b"x" * 300_000)
    assert response.status_code == 413
    assert "max_upload_bytes" in response.json()["detail"]
    assert stored_files(store_url) == []


def test_too_many_files_are_refused(client, store_url):
    response = upload(client, zip_of({"requirements.txt": b"", **{f"f{i}.py": b"" for i in range(60)}}))
    assert response.status_code == 413 and "max_files" in response.json()["detail"]
    assert stored_files(store_url) == []


def test_the_same_package_twice_is_stored_once(client, store_url):
    first = upload(client, zip_of(GOOD))
    assert first.status_code == 201, first.text
    files_after_first = stored_files(store_url)
    # the same files re-archived (one top folder, other order): the same package
    again = upload(client, zip_of({f"pkg/{k}": v for k, v in reversed(GOOD.items())}))
    assert again.status_code == 201
    assert again.json()["digest"] == first.json()["digest"]
    assert (first.json()["reused"], again.json()["reused"]) == (False, True)
    assert sorted(first.json()["files"]) == sorted(GOOD)
    assert stored_files(store_url) == files_after_first
    assert len([f for f in files_after_first if f.endswith("fit/train.py")]) == 1


def test_an_upload_needs_a_known_token(client):
    assert client.post("/v1/package", files={"file": ("p.zip", zip_of(GOOD))}).status_code == 401
    assert client.post("/v1/package", headers={"Authorization": "Bearer nope"},
                       files={"file": ("p.zip", zip_of(GOOD))}).status_code == 401


def test_a_chunked_body_over_the_limit_is_refused_while_it_streams(client, store_url):
    boundary = "b0undary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"p.zip\"\r\n"
            "Content-Type: application/zip\r\n\r\n").encode()

    def body():  # no Content-Length: sent chunked
        yield head
        for _ in range(40):
            yield b"x" * 16_384
        yield f"\r\n--{boundary}--\r\n".encode()

    response = client.post("/v1/package", content=body(), headers={
        **TOKEN, "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert response.status_code == 413, response.text
    # refused by the streaming limit, before the multipart parser spooled it all
    assert "the request body is over" in response.json()["detail"]
    assert stored_files(store_url) == []


def test_the_server_command_refuses_to_start_without_tokens():
    from click.testing import CliRunner

    from job_server.cli import server_command

    result = CliRunner().invoke(server_command, [])
    assert result.exit_code != 0 and "no tokens" in result.output


def test_the_seeds_requirments_txt_is_read_as_requirements_with_a_warning(client):
    # seed 001's example project: quick_start/{trainer.py, dataset.py, requirments.txt}
    seed = {"quick_start/trainer.py": b"print(1)\n", "quick_start/dataset.py": b"",
            "quick_start/requirments.txt": b"pillow\nprotobuf==3.1.0\n"}
    response = upload(client, zip_of(seed))
    assert response.status_code == 201, response.text
    stored = response.json()
    assert "requirements.txt" in stored["files"] and "requirments.txt" in stored["files"]
    assert len(stored["warnings"]) == 1
    assert "requirments.txt (seed 001's spelling) is read as requirements.txt (pillow, " \
           "protobuf==3.1.0)" in stored["warnings"][0]
    both = upload(client, zip_of({**GOOD, "requirments.txt": b"pillow\n"}))
    assert both.status_code == 422 and "both requirements.txt and requirments.txt" in both.text
