"""The backends: where a job's processes run (`k8s`: Kubernetes; `local`: this machine).

Each implements the core's `paddlecloud.deployer.Deployer` contract; they import the
core, never each other, the SDK, a component or the CLI (tests/test_layers.py).
"""
