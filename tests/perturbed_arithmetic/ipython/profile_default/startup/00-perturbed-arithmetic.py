# Startup file of the perturbed-arithmetic pass (CONTRIBUTING.md): every IPython kernel started with
# IPYTHONDIR=tests/perturbed_arithmetic/ipython enters PerturbedArithmetic before the first cell runs,
# so torch's order-dependent results are one ulp away from this machine's, as on another CPU.
import importlib.util as _ilu
import pathlib as _pl

_spec = _ilu.spec_from_file_location(
    "perturbed_arithmetic", _pl.Path(__file__).resolve().parents[3] / "perturb.py")
_mod = _ilu.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
_PERTURBED_ARITHMETIC_MODE = _mod.PerturbedArithmetic()
_PERTURBED_ARITHMETIC_MODE.__enter__()
__perturbed_arithmetic__ = True
del _ilu, _pl, _spec
