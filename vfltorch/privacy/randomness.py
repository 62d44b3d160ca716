"""Where the secret randomness of a private run comes from: OS entropy, or an explicit simulation seed.

A differential-privacy guarantee rests on randomness nobody can replay: the
batch schedule (amplification by subsampling needs the batches to be secret
from the observer) and the Gaussian noise (whoever can regenerate it removes
it). ``Randomness()`` - the default - seeds every generator from
``secrets.randbits(128)`` (numpy's PCG64 takes the 128 bits; torch generators,
which opacus needs, take 64), and the seeds are never stored, logged or
written out.

``Randomness(simulation_seed=s)`` derives every generator from (s, name)
instead: runs are reproducible (tests, "federated == centralised", figures),
and the guarantee is void - anyone who knows s replays the schedule and the
noise. Every output of such a run says so (``VOID_NOTE``): the JSON record,
the console and the TensorBoard tags.
"""

from __future__ import annotations

import hashlib
import secrets
import warnings

import numpy as np
import torch

VOID_NOTE = ("SIMULATION MODE: the batch schedule and the DP noise were seeded from the simulation seed; anyone "
             "who knows it replays them and removes the noise. The differential-privacy guarantee is VOID.")
VOID_TAG = "SIMULATION-DP-VOID/"


class SimulationWarning(UserWarning):
    """A run seeded its secret randomness: its epsilon promises nothing."""


def _derived(seed: int, name: str, bits: int) -> int:
    digest = hashlib.sha256(f"vfltorch.privacy/{int(seed)}/{name}".encode()).digest()
    return int.from_bytes(digest[:bits // 8], "little")


class Randomness:
    """A factory of named generators for one party's run (see the module docstring)."""

    def __init__(self, simulation_seed: int | None = None):
        if simulation_seed is not None and (isinstance(simulation_seed, bool) or not isinstance(
                simulation_seed, (int, np.integer))):
            raise TypeError(f"simulation_seed must be an int or None, got {simulation_seed!r}")
        self.simulation_seed = None if simulation_seed is None else int(simulation_seed)

    @property
    def simulated(self) -> bool:
        return self.simulation_seed is not None

    @property
    def source(self) -> str:
        """What the JSON record says about the secret randomness (never the seed of a real run: there is none)."""
        return "simulation seed (guarantee void)" if self.simulated else "os entropy (secret, not recorded)"

    def seed128(self, name: str) -> int:
        return secrets.randbits(128) if not self.simulated else _derived(self.simulation_seed, name, 128)

    def numpy(self, name: str) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(self.seed128(name)))

    def torch(self, name: str, device="cpu") -> torch.Generator:
        g = torch.Generator(device=device)
        g.manual_seed(secrets.randbits(64) if not self.simulated else _derived(self.simulation_seed, name, 64))
        return g

    def warn(self) -> None:
        if self.simulated:
            warnings.warn(VOID_NOTE, SimulationWarning, stacklevel=3)


def numpy_from_seed128(seed: int) -> np.random.Generator:
    """The generator a party rebuilds from a 128-bit seed it was sent (the vertical batch schedule)."""
    return np.random.Generator(np.random.PCG64(int(seed)))
