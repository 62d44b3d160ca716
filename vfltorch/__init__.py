"""vfltorch: vertical federated learning on PyTorch.

Several parties hold different columns about the same rows; one of them (the
*active* party) holds the labels. Every method here runs as one process per
party over ``torch.distributed`` and keeps each party's raw columns inside its
own process. See ``vfltorch.comm`` for the runtime and ``vfltorch.data`` for the
vertical data layer.
"""

__version__ = "0.1.0"
