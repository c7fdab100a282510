"""The pserver agent: `paddlecloud pserver [options] -- <pserver command...>`.

It takes a pserver slot of the job in etcd (`slots`), waits until every slot is
registered, then runs the pserver command with the PaddlePaddle environment of
docs/design.md section 8 and supervises it (`supervisor`: restarts with backoff, the
restore contract) until the job is done (`jobwatch`), releasing the slot when it
exits (`agent`). `stub` is a stand-in pserver for tests. The CLI and its exit codes:
`cli`.
"""
