"""Federation runtime on torch.distributed: one process per party.

* ``Federation`` - a party's handle: roles, point-to-point messages, meter,
  transcript, failure handling (``federation.py``).
* ``launch`` / ``init_from_env`` - Q local processes, or one party under
  torchrun / mpirun (``launcher.py``).
* ``reduce`` / ``broadcast`` / ``allreduce`` - the one reduction routine, over
  the FDSKL pairwise tree, a star or a ring (``reduce.py``, ``topology.py``).
* ``masked_sum`` / ``secure_sum`` - FDSKL Algorithm 3 with phase or ring masks
  (``masking.py``); ``MaskStream`` - the one mask stream type.
* ``connect_federation`` - one party of a federation file across organisations:
  every link TLS 1.3, mutually authenticated with pinned certificates
  (``link.py``, ``federation_file.py``, ``identity.py``).
* ``sharing`` - secret-shared arithmetic: additive shares on Z_2^64, Beaver
  triples from a dealer, opening (``sharing.py``).
"""

from .errors import FederationError, PartyFailure
from .federation import DEFAULT_TIMEOUT, Federation, check_backend, default_timeout
from .launcher import init_from_env, launch, under_mpirun, under_torchrun
from .link import LinkError, TLSMesh, connect_federation
from .masking import FixedPoint, MaskStream, PhaseGroup, RingGroup, masked_sum, secure_allreduce, secure_sum
from . import sharing
from .meter import CommMeter
from .reduce import allreduce, broadcast, reduce
from .roles import Roles
from .topology import (Ring, Star, Tree, are_totally_different, build, masked_sum_leakage, pairwise_tree,
                       ring, star, totally_different_trees)
from .transcript import Message, Transcript

__all__ = [
    "CommMeter", "DEFAULT_TIMEOUT", "Federation", "FederationError", "FixedPoint", "LinkError", "TLSMesh", "connect_federation", "MaskStream", "Message",
    "PartyFailure", "PhaseGroup", "Ring", "RingGroup", "Roles", "Star", "Transcript", "Tree", "allreduce",
    "are_totally_different", "broadcast", "build", "check_backend", "default_timeout", "init_from_env", "launch",
    "masked_sum", "masked_sum_leakage", "pairwise_tree", "reduce", "ring", "secure_allreduce", "secure_sum",
    "sharing", "star", "totally_different_trees", "under_mpirun", "under_torchrun",
]
