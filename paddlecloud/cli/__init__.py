"""The `paddlecloud` command, the top of the house: it may import every layer below it.

`main` is the entry point; `jobs` (`paddlecloud job ...`) and `local` (`paddlecloud local
...`) are its own commands; the components' commands (`master`, `trainer`, `pserver`,
`operator`, `server`, `credentials`, `autoscaler`) are found through the entry-point
group `paddlecloud.commands` (pyproject.toml), so nothing below imports the CLI back.
"""
