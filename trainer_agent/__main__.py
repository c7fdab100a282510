"""`python -m trainer_agent -- <command>`: the trainer launcher (same as `paddlecloud trainer`)."""

from trainer_agent.launcher import trainer_command

trainer_command(prog_name="python -m trainer_agent")
