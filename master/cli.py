"""`paddlecloud master`: the per-job master process (flags of DESIGN.md section 8)."""

from __future__ import annotations

import logging
import sys

import click

from paddlecloud.clitypes import DURATION, NON_NEGATIVE, POSITIVE, SIZE, log_level_option

DEFAULT_ELECTION_TTL = "10s"  # also what bench/scale.py assumes when no flag says


@click.command("master")
@click.option("--job", required=True, envvar="PADDLE_JOB_NAME", show_envvar=True, help="Job name.")
@click.option("--namespace", default="local", show_default=True, envvar="PADDLE_NAMESPACE", show_envvar=True,
              help="Kubernetes namespace, or 'local'.")
@click.option("--etcd-endpoints", required=True, envvar="PADDLE_ETCD_ENDPOINTS", show_envvar=True,
              help="Comma-separated etcd URLs.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="The gRPC port trainers and clients call (0: any free port).")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--advertise", default="", help="HOST:PORT published as leader [default: POD_IP:PORT with POD_IP from the environment, "
                   "else 127.0.0.1:PORT].")
@click.option("--input", "inputs", multiple=True,
              help="Input path, glob or fsspec URL (repeatable). Without it the master waits for SetDataset.")
@click.option("--format", "fmt", default="lines", show_default=True,
              help="Data format: lines (csv, tsv, jsonl, text) or file.")
@click.option("--chunk-bytes", type=SIZE, default="64MiB", show_default=True, help="Chunk size.")
@click.option("--chunks-per-task", type=NON_NEGATIVE, default=1, show_default=True,
              help="Chunks grouped into one task (what a trainer is handed at once).")
@click.option("--epochs", type=NON_NEGATIVE, default=1, show_default=True, help="Passes over the input.")
@click.option("--shuffle-seed", type=int, default=0, show_default=True,
              help="Seed of each epoch's task order (the same seed deals the same order).")
@click.option("--start-epoch", type=NON_NEGATIVE, default=0, show_default=True,
              help="Epoch to start at when etcd holds no state for the job (etcd wins when it does).")
@click.option("--resume-from", metavar="PATH",
              help="A checkpoint directory (local or fsspec URL): start at its TrainStatus.next() "
                   "when etcd holds no state for the job.")
@click.option("--session-ttl", type=DURATION, default="30s", show_default=True,
              help="Trainer session lease: longer than a failover (--election-ttl plus the rebuild), "
                   "so trainers keep their sessions when the leader dies.")
@click.option("--election-ttl", type=DURATION, default=DEFAULT_ELECTION_TTL, show_default=True,
              help="The leader's etcd lease: a dead leader's standby takes over within this.")
@click.option("--failover-hold", type=DURATION, default="2s", show_default=True,
              help="A master that does not serve (a standby, a leader still loading) holds a trainer's "
                   "call this long and serves it if it leads meanwhile, so that after a failover "
                   "the trainers are served at once, not one retry later; 0 answers at once.")
@click.option("--task-timeout", type=DURATION, default="30m", show_default=True, help="0 turns it off.")
@click.option("--max-task-failures", type=NON_NEGATIVE, default=3, show_default=True,
              help="Failures of a task in an epoch past which it is failed for the rest of the epoch.")
@click.option("--max-tasks-per-trainer", type=POSITIVE, default=2, show_default=True,
              help="Tasks a trainer may hold at once (the one it reads and those it prefetched).")
@click.option("--work-stealing/--no-work-stealing", default=True, show_default=True,
              help="At an epoch's end, cut the unread rest off a straggler's task (at the record its "
                   "trainer reached, with its agreement) and hand it to an idle trainer; every record "
                   "is still read once (docs/design.md section 5a).")
@click.option("--max-calls-in-flight", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Trainer calls the master works on at once; past it a call is answered "
                   "RESOURCE_EXHAUSTED at once and the trainer retries with jittered backoff. "
                   "GetTasks on streams are never shed: they wait their turn.")
@click.option("--register-rate", type=click.FloatRange(min=0, min_open=True), default=100.0, show_default=True,
              help="RegisterTrainer calls per second per token, once a burst is spent; past it a call "
                   "is answered RESOURCE_EXHAUSTED with a retry delay (the trainer waits and retries).")
@click.option("--register-burst", type=click.IntRange(min=1), default=20_000, show_default=True,
              help="RegisterTrainer calls per token at once: every trainer of the largest job registers in one burst.")
@click.option("--task-streams/--no-task-streams", default=True, show_default=True,
              help="Serve GetTaskStream. Off, it answers UNIMPLEMENTED and trainers send each GetTask "
                   "as a call of its own: about 0.6 of the dispatch at 64 trainers, but thousands starting "
                   "at once are all served sooner (docs/benchmarks.md).")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Serve the status page, its JSON and Prometheus metrics on this port (on --host).")
@click.option("--deployer", type=click.Choice(["none", "kubernetes", "local"]), default="none", show_default=True,
              help="kubernetes: the leader creates the job's pservers and trainers (needs --job-spec); "
                   "local: `paddlecloud local train` runs them. With none, the job's end is final "
                   "(RestartEpoch reopen=true is refused).")
@click.option("--job-spec", type=click.Path(exists=True, dir_okay=False),
              help="The job spec YAML that `paddlecloud job submit` mounts (for --deployer kubernetes).")
@click.option("--trainers", type=click.IntRange(min=1), default=None,
              help="The trainer group's size at start (the job's desired size; etcd wins once written).")
@click.option("--min-trainers", type=click.IntRange(min=1), default=None,
              help="The fewest trainers the job may be scaled to [default: --trainers].")
@click.option("--max-trainers", type=click.IntRange(min=1), default=None,
              help="The most trainers the job may be scaled to [default: --trainers].")
@click.option("--etcd-timeout", type=DURATION, default="10s", show_default=True,
              help="Give up at start when etcd does not answer within this.")
@click.option("--etcd-ca-file", envvar="PADDLE_ETCD_CA_FILE", show_envvar=True,
              help="CA of https:// etcd endpoints.")
@click.option("--etcd-cert-file", envvar="PADDLE_ETCD_CERT_FILE", show_envvar=True,
              help="Client certificate for etcd.")
@click.option("--etcd-key-file", envvar="PADDLE_ETCD_KEY_FILE", show_envvar=True, help="Its private key.")
@click.option("--etcd-user", envvar="PADDLE_ETCD_USER", show_envvar=True, help="etcd user (auth enabled).")
@click.option("--etcd-password-file", envvar="PADDLE_ETCD_PASSWORD_FILE", show_envvar=True,
              help="File holding the etcd user's password (else the environment's PADDLE_ETCD_PASSWORD).")
@click.option("--tokens-dir", type=click.Path(file_okay=False),
              help="The job's tokens (files trainer, operator, viewer): every RPC must carry one.")
@click.option("--scaler-token-file", type=click.Path(dir_okay=False),
              help="The cluster autoscaler's token of this --namespace (one naming another is refused): "
                   "accepted for GetStatus and ScaleTrainers only; re-read when the file changes; "
                   "absent or empty: no autoscaler (needs --tokens-dir).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Serve TLS with this certificate (PEM).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="... and its private key.")
@click.option("--tls-client-ca", type=click.Path(exists=True, dir_okay=False),
              help="mTLS: require client certificates signed by this CA.")
@click.option("--insecure", is_flag=True,
              help="Allow no --tokens-dir off loopback: anyone who reaches the port may do anything.")
@click.option("--allow-set-dataset", "set_dataset_prefixes", multiple=True, metavar="PREFIX",
              help="Accept SetDataset for paths under PREFIX (a scheme like s3://bucket/ or a directory); "
                   "repeatable. Without it SetDataset is off.")
@log_level_option
def master_command(job, namespace, etcd_endpoints, port, host, advertise, inputs, fmt, chunk_bytes,
                   chunks_per_task, epochs, shuffle_seed, start_epoch, resume_from, session_ttl, election_ttl,
                   failover_hold, task_timeout, max_task_failures, max_tasks_per_trainer,
                   work_stealing, max_calls_in_flight, register_rate, register_burst, task_streams, metrics_port, deployer, job_spec, trainers, min_trainers, max_trainers, etcd_timeout,
                   etcd_ca_file, etcd_cert_file, etcd_key_file, etcd_user, etcd_password_file,
                   tokens_dir, scaler_token_file, tls_cert, tls_key, tls_client_ca, insecure,
                   set_dataset_prefixes, log_level) -> None:
    """Run the master of one job: hands out data tasks, keeps every lease in etcd."""
    from master.config import DatasetSpec, MasterConfig, Policy, SpecError, TlsFiles
    from master.server import serve
    from paddlecloud import aio
    from paddlecloud.elastic import TrainerRange
    from paddlecloud.etcd import EtcdCredentials, parse_endpoints

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        parse_endpoints(etcd_endpoints)
        dataset = None
        if inputs:
            dataset = DatasetSpec(paths=tuple(inputs), format=fmt, chunk_bytes=chunk_bytes,
                                  chunks_per_task=chunks_per_task, num_epochs=epochs,
                                  shuffle_seed=shuffle_seed).filled()
        if resume_from:
            from paddlecloud.checkpoints import resume_epoch

            resumed = resume_epoch(resume_from)
            if resumed:
                start_epoch = max(start_epoch, resumed)
                logging.getLogger("master").info("checkpoint in %s: starting at epoch %d",
                                                 resume_from, start_epoch)
        if bool(tls_cert) != bool(tls_key) or (tls_client_ca and not tls_cert):
            raise SpecError("--tls-cert and --tls-key go together (and --tls-client-ca needs them)")
        etcd_credentials = EtcdCredentials.from_env(
            ca_file=etcd_ca_file, cert_file=etcd_cert_file, key_file=etcd_key_file, user=etcd_user,
            password_file=etcd_password_file)
        if (deployer == "kubernetes") != bool(job_spec):
            raise SpecError("--deployer kubernetes and --job-spec go together")
        if job_spec:
            from pathlib import Path

            from paddlecloud.jobspec import JobSpec
            spec = JobSpec.from_yaml(Path(job_spec).read_text()).validate()
            trainers, min_trainers, max_trainers = spec.trainers, spec.min_trainers, spec.max_trainers
        trainer_size = None
        if trainers is not None or min_trainers is not None or max_trainers is not None:
            trainer_size = TrainerRange.of(trainers=trainers, minimum=min_trainers, maximum=max_trainers)
        config = MasterConfig(
            job=job, namespace=namespace, etcd_endpoints=etcd_endpoints, port=port, host=host,
            advertise=advertise, election_ttl=election_ttl, failover_hold=failover_hold, dataset=dataset,
            start_epoch=start_epoch,
            metrics_port=metrics_port, etcd_timeout=etcd_timeout, job_spec=job_spec, deployer=deployer,
            trainer_size=trainer_size,
            max_calls_in_flight=max_calls_in_flight, task_streams=task_streams,
            register_rate=register_rate, register_burst=register_burst,
            set_dataset_prefixes=tuple(set_dataset_prefixes), tokens_dir=tokens_dir, insecure=insecure,
            scaler_token_file=scaler_token_file,
            tls=TlsFiles(tls_cert, tls_key, tls_client_ca) if tls_cert else None,
            etcd_credentials=etcd_credentials,
            policy=Policy(session_ttl=session_ttl, task_timeout=task_timeout,
                          max_task_failures=max_task_failures,
                          max_tasks_per_trainer=max_tasks_per_trainer, work_stealing=work_stealing),
        )
        config.check_access()
    except (SpecError, ValueError) as error:
        raise click.UsageError(str(error)) from None
    sys.exit(aio.run(serve(config)))


@click.command("credentials")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--tls-host", "hosts", multiple=True, metavar="HOST",
              help="Also mint a CA (ca.crt) and a master certificate (master.crt, master.key) for HOST "
                   "(a DNS name or IP; repeatable).")
def credentials_command(directory: str, hosts: tuple[str, ...]) -> None:
    """Write a job's fresh tokens into DIRECTORY/tokens (trainer, operator, viewer; mode 0600).

    \b
    The master:  paddlecloud master --tokens-dir DIRECTORY/tokens ...
    A client:    PADDLE_JOB_TOKEN_FILE=DIRECTORY/tokens/ROLE
    With --tls-host, a client also: PADDLE_MASTER_CA_FILE=DIRECTORY/ca.crt"""
    from pathlib import Path

    from paddlecloud.auth import JobTokens
    from paddlecloud.tls import LocalCA, subject_name

    for host in hosts:  # all checked before anything is written
        try:
            subject_name(host)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--tls-host") from None
    root = Path(directory)
    try:
        tokens = JobTokens.generate().write(root / "tokens")
        click.echo(f"tokens in {tokens}: master --tokens-dir {tokens}")
        if hosts:
            ca = LocalCA.create()
            ca.write_cert(root / "ca.crt")
            issued = ca.issue(root, "master", hosts=hosts)
            click.echo(f"TLS: master --tls-cert {issued.cert} --tls-key {issued.key}; "
                       f"clients PADDLE_MASTER_CA_FILE={root / 'ca.crt'}")
    except OSError as error:  # a missing parent, a read-only place: say which, not a traceback
        raise click.ClickException(f"cannot write the credentials into {directory[:200]}: "
                                   f"{error.strerror or error}") from None
