"""Kubernetes support shared by the CLI (`paddlecloud job ...`) and the master's deployer.

`manifests` renders the job's objects as plain dicts, with no I/O; `client` is how
every caller talks to an API server (credentials, retries, errors that say what to
do), for `paddlecloud.backends.k8s.deployer`, `paddlecloud.cli.jobs` and `pdj_operator`;
`jobs` creates, reads and deletes one job's objects (`job submit`, the job server
and the Python API share it); `image_build` renders and runs the Kaniko Job that
builds a package's runtime image; `portwatch` is the helper that runs beside images
without paddlecloud.
"""
