"""Where the ranks of one tensor-parallel group live: one machine or several.

A group of `size` ranks spreads over `nnodes` machines, `size // nnodes` ranks on each; node
0 holds rank 0 (the scheduler), and every rank meets the others through rank 0's address
(`master_addr:master_port`, torch.distributed's TCP rendezvous). The same code runs one node
on 127.0.0.1 or several across a network. Left out, each place is read from the environment
variables torchrun sets (`MASTER_ADDR`, `MASTER_PORT`, `GROUP_RANK` or `NODE_RANK`, and
`WORLD_SIZE` / `LOCAL_WORLD_SIZE` for the node count).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Cluster:
    """`size` ranks on `nnodes` machines; this machine is `node_rank`. Port 0 on a single
    node means any free port."""

    size: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError(f"tensor_parallel_size must be at least 2, got {self.size}")
        if self.nnodes < 1 or self.size % self.nnodes:
            raise ValueError(
                f"--nnodes {self.nnodes} must divide tensor_parallel_size {self.size}: every "
                "node runs the same number of ranks"
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and not self.master_port:
            raise ValueError("several nodes need --master-port: where rank 0 listens")

    @property
    def local_ranks(self) -> range:
        """The ranks this node runs."""
        per_node = self.size // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"

    def with_port(self) -> Cluster:
        """This cluster with a free port on 127.0.0.1 in place of port 0."""
        if self.master_port:
            return self
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((self.master_addr, 0))
            return replace(self, master_port=probe.getsockname()[1])

    @classmethod
    def of(
        cls,
        size: int,
        *,
        nnodes: int | None = None,
        node_rank: int | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
        environment: Mapping[str, str] = os.environ,
    ) -> Cluster:
        """The cluster from what was given, torchrun's variables for what was not."""
        if nnodes is None and {"WORLD_SIZE", "LOCAL_WORLD_SIZE"} <= environment.keys():
            nnodes = int(environment["WORLD_SIZE"]) // int(environment["LOCAL_WORLD_SIZE"])
        if node_rank is None:
            node_rank = int(environment.get("GROUP_RANK", environment.get("NODE_RANK", 0)))
        return cls(
            size,
            nnodes=nnodes or 1,
            node_rank=node_rank,
            master_addr=master_addr or environment.get("MASTER_ADDR", "127.0.0.1"),
            master_port=master_port or int(environment.get("MASTER_PORT", 0)),
        )
