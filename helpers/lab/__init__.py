"""helpers.lab: the course's measuring instruments, beside the reference code rather than inside it.

Nothing here is a piece of a transformer; each module measures or reports one:

* :mod:`helpers.lab.sweep` -- ``sweep(fn, seeds)``: an experiment over seeds in worker processes,
  and ``SweepResult``, its per-seed results (notebooks 03-06, ``experiments/``).
* :mod:`helpers.lab.stats` -- paired comparisons, censored time-to-threshold, "k of n" intervals
  (``scipy.stats``, imported on first use).
* :mod:`helpers.lab.roundoff` -- ``roundoff(err)``: how every notebook prints a rounding error
  (the tests mask it, because its digits depend on the CPU).
* :mod:`helpers.lab.traffic` -- ``memory_traffic``: the bytes an ideal kernel would move for each
  torch call (notebook 02 §6, appendix 02a).
* :mod:`helpers.lab.memory` -- ``peak_memory``: the peak bytes of the tensors a call creates
  (notebook 08 §3).
* :mod:`helpers.lab.rope_kernel` -- ``fused_apply_rope``: an opt-in fused C kernel for bfloat16/float16
  RoPE, measured in appendix 02a §3. Not imported here: nothing loads it unless asked.

Import from here: ``from helpers.lab import paired, roundoff``.
"""
from .memory import AllocationCounter, MemoryReport, peak_memory
from .roundoff import roundoff
from .stats import Censored, PairedComparison, k_of_n_interval, paired, proportion_interval, time_to_threshold
from .sweep import SweepError, SweepResult, first_step_reaching, sweep
from .traffic import memory_traffic

__all__ = [
    "AllocationCounter", "MemoryReport", "peak_memory", "roundoff",
    "Censored", "PairedComparison", "k_of_n_interval", "paired", "proportion_interval", "time_to_threshold",
    "SweepError", "SweepResult", "first_step_reaching", "sweep", "memory_traffic",
]
