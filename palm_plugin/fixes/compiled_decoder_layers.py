"""fairseq's decoder layers under ``torch.compile``: one graph per layer, and none past the eighth.

fairseq's ``TransformerDecoderLayer`` asks its self-attention for the incremental-decoding buffer on every call, in
training too, where there is none (``incremental_state`` is None). ``FairseqIncrementalState.get_incremental_state``
builds the buffer's key from the module's random ``_incremental_state_id`` before it looks at ``incremental_state``,
so dynamo guards each compiled layer on its own id: under ``--compile-layers`` every decoder layer compiles a graph of
its own, and from the ninth (torch's recompile limit, 8) the layers run uncompiled, with a warning. Seen in PALM
base's decoder on an H100 (docs/benchmarks-gpu.md, section 7). The lookup now answers None before it builds the key
when there is no state: the same result, and one graph serves every decoder layer.
"""
from fairseq.incremental_decoding_utils import FairseqIncrementalState


def install():
    """Make ``get_incremental_state`` return None at once without a state (idempotent)."""
    original = FairseqIncrementalState.get_incremental_state
    if getattr(original, "__palm_plugin__", False):
        return

    def get_incremental_state(self, incremental_state, key):
        if incremental_state is None:
            return None
        return original(self, incremental_state, key)

    get_incremental_state.__palm_plugin__ = True
    get_incremental_state.__doc__ = original.__doc__
    FairseqIncrementalState.get_incremental_state = get_incremental_state
