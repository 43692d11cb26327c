"""Triton's interpreter (``TRITON_INTERPRET=1``) as the tests run kernels on a CPU, with one fix and two speed-ups.

Triton 3.6's interpreter turns a loop bound loaded from memory (``range(0, tl.load(p))``) into an int with ``int()``
of a one-element array, which numpy 2 refuses; compiled kernels take such bounds as they are. :func:`install` makes
the interpreter read the element instead. A process that runs kernels under the interpreter installs it before its
first kernel call: the interpreted tests in-process, the suite's tool processes (fairseq-train) at start
(tests/startup/sitecustomize.py). The speed-ups (:func:`reduce_in_halves`, :func:`patch_the_language_once_a_launch`)
leave every value as the interpreter computes it; they only cut its time.
"""
import numpy as np


def install():
    from triton.runtime import interpreter

    if getattr(interpreter, "_palm_scalar_index", False):
        return
    patch_lang_tensor = interpreter._patch_lang_tensor

    def patch_with_scalar_index(tensor, scope):
        patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_with_scalar_index
    reduce_in_halves()
    patch_the_language_once_a_launch()
    interpreter._palm_scalar_index = True


def reduce_in_halves():
    """Triton 3.6's interpreter runs a reduction by a combine function of the kernel's own (the dQ kernel's bitwise or
    of the buckets a tile reaches) one element at a time, a Python call each: with the bias, most of a backward's
    time. Here it combines pairs of elements at once, the kernel's function on arrays (log2 n calls): the same value
    for the associative functions a reduction takes, combined in a tree as a GPU combines them."""
    from triton.runtime import interpreter

    def generic_reduce(self, inputs):
        axis_given = self.axis
        inputs, axis = self.unravel(inputs, self.axis)
        dtypes, shape = [t.dtype for t in inputs], inputs[0].handle.data.shape
        data = [np.moveaxis(t.handle.data, axis, 0) for t in inputs]
        while len(data[0]) > 1:
            pairs = len(data[0]) // 2
            combined = self.combine_fn.fn(*(self.to_tensor(d[0:2 * pairs:2], t) for d, t in zip(data, dtypes)),
                                          *(self.to_tensor(d[1:2 * pairs:2], t) for d, t in zip(data, dtypes)))
            combined = combined if isinstance(combined, tuple) else (combined,)
            data = [np.concatenate([c.handle.data, d[2 * pairs:]]) for c, d in zip(combined, data)]  # odd: the last
        results = [d[0] for d in data]
        if self.keep_dims:
            results = [np.expand_dims(r, axis) if axis_given is not None else r.reshape((1,) * len(shape))
                       for r in results]
        elif axis_given is None:
            results = [r.item() for r in results]
        return [self.to_tensor(r, t) for r, t in zip(results, dtypes)]

    interpreter.ReduceOps.generic_reduce = generic_reduce


def patch_the_language_once_a_launch():
    """Triton 3.6's interpreter patches triton.language (its builtins, the tensor's methods) for a launch, and again at
    each call of a jitted function inside it, which finds them patched: a quarter of the time of the kernels here.
    Here such a call patches only the modules the launch has not patched yet."""
    import triton.language as tl
    from triton.runtime import interpreter

    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    patched = set()

    def run_launch(self, *args, **kwargs):
        patched.clear()
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.clear()

    def patch_lang_once(fn):
        modules = {value for value in fn.__globals__.values() if value is tl or value is tl.core}
        if patched and modules <= patched:  # inside a launch that patched them
            return interpreter._LangPatchScope()
        patched.update(modules)
        return patch_lang(fn)

    interpreter.GridExecutor.__call__, interpreter._patch_lang = run_launch, patch_lang_once
