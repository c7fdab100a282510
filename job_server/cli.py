"""`paddlecloud server`: run the Job Server (uvicorn) against the cluster of a kubeconfig."""

from __future__ import annotations

import logging

import click

logger = logging.getLogger(__name__)


@click.command("server")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="YAML: store, limits, quotas, build, tokens_file (docs/job-server.md).")
@click.option("--tokens-file", type=click.Path(exists=True, dir_okay=False),
              help="YAML mapping TOKEN: [namespace, ...] (a mounted Secret).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="The HTTP port of the API and the pages.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False),
              help="Kubeconfig file (default: in-cluster, then ~/.kube/config).")
def server_command(config_path: str | None, tokens_file: str | None, host: str, port: int,
                   kubeconfig: str | None) -> None:
    """Serve the Job Server's HTTP API (/v1, /openapi.json, /docs)."""
    try:
        import uvicorn

        from job_server.app import create_app
    except ImportError:
        raise click.ClickException("`paddlecloud server` needs its extra: "
                                   "pip install 'paddlecloud[server]'") from None
    from job_server.config import ConfigError, load_config
    from paddlecloud.backends.k8s.client import KubernetesApiError, load_api_client

    try:
        config = load_config(config_path, tokens_file=tokens_file)
    except ConfigError as error:
        raise click.ClickException(str(error)) from None
    if not config.tokens:
        raise click.ClickException("no tokens: give --tokens-file (or tokens_file in --config); "
                                   "every request needs a bearer token")
    try:
        api = load_api_client(kubeconfig)
    except KubernetesApiError as error:
        raise click.ClickException(str(error)) from None
    uvicorn.run(create_app(config, api_client=api), host=host, port=port, log_level="info")
