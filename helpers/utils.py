"""Seeding and determinism shared by every notebook (the setup cell calls it)."""
from __future__ import annotations

import os
import random
import sys

import numpy as np
import torch

__all__ = ["seed_everything"]


def seed_everything(seed: int = 0, num_threads: int = 1, deterministic: bool = True) -> torch.Generator:
    """Seed Python, NumPy and torch, and fix what else changes float results.

    * ``random.seed``, ``np.random.seed``, ``torch.manual_seed`` with ``seed``.
      ``torch.manual_seed`` seeds the CPU generator *and* every CUDA device's (torch
      2.13's ``torch/random.py`` calls ``torch.cuda.manual_seed_all``, lazily when CUDA
      is not initialised yet), so CUDA needs no separate call.
    * ``torch.set_num_threads(num_threads)``: the number of threads changes how float
      sums are split, hence their last digits (measured on the course machine), so the
      notebooks fix it; 1 thread is also the fastest for their tiny models.
    * ``torch.use_deterministic_algorithms(deterministic)``, the part that eager code reads
      (``torch.are_deterministic_algorithms_enabled()``). In torch 2.13 that function also imports
      ``torch.compile``'s configuration to set its flag there, about 0.9 s on the first call of a
      process; the series never compiles, so that import is skipped unless something loaded it
      already (then torch's own function sets both). Code that compiles after this call finds
      inductor's ``config.deterministic`` at its own default (``TORCHINDUCTOR_DETERMINISTIC``);
      call ``torch.use_deterministic_algorithms`` again before ``torch.compile``.
    * On CUDA (``torch.cuda.is_available()``) with ``deterministic=True``: the
      environment variable ``CUBLAS_WORKSPACE_CONFIG`` is set to ``":4096:8"`` **if it is
      not set already** (a value you set wins). Deterministic cuBLAS matrix products need
      it (CUDA >= 10.2; see torch's "Reproducibility" notes); without it torch raises a
      ``RuntimeError`` at the first such product. cuBLAS reads it when it creates its
      workspace, so call this before the first CUDA matrix product. Without CUDA the
      environment is not touched.

    Args:
        seed: a non-negative int.
        num_threads: intra-op threads for torch, >= 1.
        deterministic: the mode of ``torch.use_deterministic_algorithms`` (above).

    Returns:
        A ``torch.Generator`` seeded with ``seed``, for data shuffling and sampling that
        must not depend on how many random numbers other code drew before.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be an int >= 1, got {num_threads!r}")
    if deterministic and torch.cuda.is_available() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # CPU and all CUDA devices
    torch.set_num_threads(num_threads)
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(deterministic)
    else:
        torch._C._set_deterministic_algorithms(deterministic, warn_only=False)
    return torch.Generator().manual_seed(seed)
