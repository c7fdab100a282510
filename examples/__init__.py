"""Example PaddlePaddle jobs for paddlecloud (`python -m examples.<name>.train`)."""
