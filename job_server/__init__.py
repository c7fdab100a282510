"""`paddlecloud server`: the Job Server — upload a package, build its image, submit, list, delete.

HTTP under `/v1` (docs/design.md section 11) on FastAPI: `app.create_app` wires the
routers (`routers/`: packages, jobs, version), the bearer-token dependency
(`auth`), the package store (`packages`) and the cluster (`cluster`). Jobs are
created by `paddlecloud.backends.k8s.jobs.create_job`, the code `paddlecloud job submit` runs.
"""
