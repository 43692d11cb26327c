"""Started in the suite's tool processes only (``tests/conftest.py:tool_env`` puts this folder on their PYTHONPATH):
scikit-learn and scipy.stats load when fairseq first uses them, not when it starts; and in a process that runs Triton
kernels under the interpreter (``TRITON_INTERPRET=1``), the interpreter's fix of tests/triton_interpreter.py.

``import fairseq`` imports every criterion, and ``sentence_prediction``'s imports pull in scikit-learn and
scipy.stats for four metrics (F1, Matthews, Pearson, Spearman): about 2.5 of the 5.5 CPU seconds a fairseq process
takes to start on the CI machine, paid by each of the suite's hundreds of processes, though only classification
runs call them. Here those modules are placeholders until then: the four functions, and any other name asked of
them, load the real module on first use; what is computed is unchanged. Users' processes import them as fairseq does.
"""
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types

DEFERRED = ("sklearn", "sklearn.metrics", "scipy.stats")
# the names fairseq binds at import (``from sklearn.metrics import f1_score``...): callables that load on first call
FUNCTIONS = {"sklearn.metrics": ("f1_score", "matthews_corrcoef"), "scipy.stats": ("pearsonr", "spearmanr")}


class _Deferred(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name in DEFERRED else None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda attribute: _attribute(spec.name, attribute)
        return module

    def exec_module(self, module):
        pass


def _real(name):
    """The real module ``name``, every placeholder dropped the first time."""
    if FINDER in sys.meta_path:
        sys.meta_path.remove(FINDER)
        for placeholder in DEFERRED:
            module = sys.modules.get(placeholder)
            if module is not None and getattr(module, "__loader__", None) is FINDER:
                del sys.modules[placeholder]
    return importlib.import_module(name)


def _attribute(name, attribute):
    if f"{name}.{attribute}" in DEFERRED and FINDER in sys.meta_path:  # from sklearn import metrics
        return importlib.import_module(f"{name}.{attribute}")
    if attribute in FUNCTIONS.get(name, ()) and FINDER in sys.meta_path:
        def deferred(*args, **kwargs):
            return getattr(_real(name), attribute)(*args, **kwargs)

        deferred.__name__ = attribute
        return deferred
    if attribute.startswith("__") and FINDER in sys.meta_path:
        raise AttributeError(attribute)
    return getattr(_real(name), attribute)


FINDER = _Deferred()
sys.meta_path.insert(0, FINDER)

if os.environ.get("TRITON_INTERPRET") == "1":
    from tests.triton_interpreter import install

    install()
