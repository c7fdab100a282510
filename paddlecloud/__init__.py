"""paddlecloud: fault-tolerant, elastic PaddlePaddle training on Kubernetes.

`from paddlecloud import PaddleJob, dist_train` is the Python API (`paddlecloud.sdk`);
it imports only the standard library and the job spec, so this import stays light.
"""

from paddlecloud.sdk import PaddleJob, dist_train

__all__ = ["PaddleJob", "dist_train"]
