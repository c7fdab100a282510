"""`paddlecloud operator`: PaddleJobs (`paddlejobs.batch.paddlepaddle.org/v1`) as Kubernetes resources.

`crd` renders the CustomResourceDefinition, `handlers` are the Kopf handlers that
give each PaddleJob its master, `status` turns what the master and the workloads
show into the PaddleJob's status, `cli` runs it. Not named `operator`: that would
shadow the standard library's module.
"""
