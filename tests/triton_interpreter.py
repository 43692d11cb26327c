"""Triton's interpreter (``TRITON_INTERPRET=1``) as the tests run kernels on a CPU, with one fix.

Triton 3.6's interpreter turns a loop bound loaded from memory (``range(0, tl.load(p))``) into an int with ``int()``
of a one-element array, which numpy 2 refuses; compiled kernels take such bounds as they are. :func:`install` makes
the interpreter read the element instead. A process that runs kernels under the interpreter installs it before its
first kernel call: the interpreted tests in-process, the suite's tool processes (fairseq-train) at start
(tests/startup/sitecustomize.py).
"""


def install():
    from triton.runtime import interpreter

    if getattr(interpreter, "_palm_scalar_index", False):
        return
    patch_lang_tensor = interpreter._patch_lang_tensor

    def patch_with_scalar_index(tensor, scope):
        patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_with_scalar_index
    interpreter._palm_scalar_index = True

