"""Turns on tests/fake_cuda.py in every Python process started with VFLTORCH_FAKE_CUDA=1 and this folder on
PYTHONPATH (``fake_cuda.fake_cuda_env``): the CLI, the launcher's fork server and the parties."""

import os

if os.environ.get("VFLTORCH_FAKE_CUDA") == "1":
    import fake_cuda

    fake_cuda.activate()
