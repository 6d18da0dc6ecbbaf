"""The cluster under the simulator (docs/simulation.md, "The cluster"; decision 0018): several
real cluster hosts over a simulated store and network in one seeded trio run."""

from .bugs import CLUSTER_BUGS
from .checks import check_single_owner
from .network import SimNetwork
from .store import MemoryCluster, MemoryStore, ReplyLost, StoreLink, StoreUnreachable
from .world import ClusterIncarnation, ClusterWorld

__all__ = [
    "CLUSTER_BUGS",
    "ClusterIncarnation",
    "ClusterWorld",
    "MemoryCluster",
    "MemoryStore",
    "ReplyLost",
    "SimNetwork",
    "StoreLink",
    "StoreUnreachable",
    "check_single_owner",
]
