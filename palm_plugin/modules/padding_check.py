"""PALM's encoder with ``--syncs-at-start``: fairseq's Transformer encoder forward, asking once whether there is padding.

fairseq's ``TransformerEncoderBase.forward_scriptable`` keeps "has padding" as a device tensor and tests it in every
layer (``encoder_padding_mask if has_pads else None``): each test makes the host wait for the device, twelve times a
forward at base size, each after a layer has been queued, which drains the queue the host should keep ahead of the
device. :func:`encode` computes the same values (the same operations, in the same order) with one test at the start.
fairseq's baselines keep their per-layer tests; the decoder's one test per forward (``prev_output_tokens.eq(pad)
.any()``) is fairseq's too and stays.
"""
from typing import Optional

import torch


def encode(encoder, src_tokens, return_all_hiddens: bool = False, token_embeddings: Optional[torch.Tensor] = None):
    """``encoder.forward_scriptable(src_tokens, ...)`` (fairseq's output dict) with one host synchronisation."""
    encoder_padding_mask = src_tokens.eq(encoder.padding_idx)
    has_pads = bool(encoder_padding_mask.any())
    x, encoder_embedding = encoder.forward_embedding(src_tokens, token_embeddings)
    if has_pads:  # fairseq multiplies by (1 - mask * has_pads) in any case: a factor of 1 without padding
        x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x))
    x = x.transpose(0, 1)  # B x T x C -> T x B x C
    encoder_states, fc_results = ([x] if return_all_hiddens else []), []
    for layer in encoder.layers:
        output = layer(x, encoder_padding_mask=encoder_padding_mask if has_pads else None)
        x, fc_result = output if isinstance(output, tuple) and len(output) == 2 else (output, None)
        if return_all_hiddens:
            encoder_states.append(x)
            fc_results.append(fc_result)
    if encoder.layer_norm is not None:
        x = encoder.layer_norm(x)
    src_lengths = src_tokens.ne(encoder.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
    return {"encoder_out": [x], "encoder_padding_mask": [encoder_padding_mask], "encoder_embedding": [encoder_embedding],
            "encoder_states": encoder_states, "fc_results": fc_results, "src_tokens": [], "src_lengths": [src_lengths]}
