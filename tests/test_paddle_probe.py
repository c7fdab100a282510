"""The PS refusal's judgement of a probe's output (paddlecloud.paddle_probe), without a Paddle."""

from __future__ import annotations

import json

import pytest

from paddlecloud.paddle_probe import imports_paddle, refusal

pytestmark = pytest.mark.unit


def _probe(**found) -> str:
    return json.dumps(found) + "\n"


def test_a_paddle_without_the_ps_core_is_refused_naming_its_version_and_the_fix():
    error = refusal(_probe(paddle="3.3.1", ps_core=False), where="--python /x/python", required=True)
    assert error is not None
    assert "PaddlePaddle 3.3.1 (--python /x/python) has no parameter-server core" in error
    assert "paddlepaddle==2.6.2" in error and "protobuf>=4.21,<5" in error


def test_a_paddle_with_the_ps_core_passes():
    assert refusal(_probe(paddle="2.6.2", ps_core=True), where="image i", required=True) is None


def test_no_paddle_is_refused_only_where_the_module_needs_one():
    output = _probe(paddle=None, error="ModuleNotFoundError: No module named 'paddle'")
    assert refusal(output, where="image i", required=False) is None
    error = refusal(output, where="--python p", required=True)
    assert error is not None and "No module named 'paddle'" in error


def test_a_probe_that_printed_no_json_is_an_error_quoting_it():
    error = refusal("Traceback ...\nImportError: bad numpy", where="image i", required=False)
    assert error is not None and "bad numpy" in error


@pytest.mark.parametrize(("source", "expected"), [
    ("import paddle\n", True),
    ("import paddle.distributed.fleet as fleet\n", True),
    ("def f():\n    from paddle.distributed import fleet\n", True),
    ("import paddlecloud\nfrom trainer_agent import TaskClient\n", False),
    ("# import paddle\nx = 'import paddle'\n", False),
])
def test_imports_paddle(source, expected):
    assert imports_paddle(source) is expected
