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

from .._lazy import lazy_exports

# submodule -> the names it exports, imported on first use (`vfl --help` needs no torch);
# submodules such as ``sharing`` are imported on first access too.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "errors": "FederationError PartyFailure",
    "federation": "DEFAULT_TIMEOUT Federation check_backend default_timeout",
    "launcher": "init_from_env launch",
    "start": "under_mpirun under_torchrun",
    "link": "LinkError TLSMesh connect_federation",
    "masking": "FixedPoint MaskStream PhaseGroup RingGroup RowMasks derived_key masked_sum secure_allreduce secure_sum",
    "meter": "CommMeter",
    "reduce": "allreduce broadcast reduce",
    "roles": "Roles",
    "topology": "Ring Star Tree are_totally_different build masked_sum_leakage pairwise_tree ring star totally_different_trees",
    "transcript": "Message Transcript",
})
__all__ = [*__all__, "sharing"]
