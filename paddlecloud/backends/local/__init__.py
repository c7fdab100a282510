"""The local backend: `paddlecloud local train` runs a whole job on this machine."""
