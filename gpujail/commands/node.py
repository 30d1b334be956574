"""`gpujail node --run-dir DIR [--index I]`: the node agent a launcher starts on each node (gpujail/launchers/agent.py).

Also `python -m gpujail node ...`. Everything it needs is in DIR (written by the coordinator of
`gpujail run --launcher ...` / `gpujail reproduce --launcher ...`) and this installed gpujail.
"""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("node", help="the node agent a launcher starts on each node (not for people)",
                       description="Serve one node of a run whose coordinator writes DIR: make worker namespaces, "
                                   "run the implementation and the probes, record into DIR/nodes/I/.")
    p.add_argument("--run-dir", required=True, help="the run directory on the shared file system")
    p.add_argument("--index", type=int, default=None,
                   help="this agent's index (default: $SLURM_PROCID, else $JOB_COMPLETION_INDEX, else 0)")


def node(args) -> int:
    from gpujail.launchers import agent
    return agent.main(args.run_dir, args.index)
