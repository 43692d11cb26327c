"""The special symbols the tasks add to a fairseq dictionary, defined once.

``<mask>`` is fairseq's own mask symbol (``masked_lm``, RoBERTa): BERT's [MASK], UniLM's [MASK] and UniLMv2's [M].
``<pseudo>`` is UniLMv2's pseudo mask [P] (Bao et al. 2020, section 3.2), also its decoding placeholder. Tasks add
them with ``dictionary.add_symbol`` in this order, so the embedding rows of a pre-trained checkpoint line up with
the fine-tuning dictionary.
"""
MASK_SYMBOL = "<mask>"
PSEUDO_SYMBOL = "<pseudo>"


def replacement_exclusions(dictionary) -> tuple:
    """``(index of <pseudo>,)`` when ``dictionary`` holds it (UniLMv2's and converted UniLMv2 dictionaries), else
    ``()``: the indices a random replacement must never draw besides [MASK] (the pseudo mask only marks a slot to
    predict, never a token of the text)."""
    index = dictionary.index(PSEUDO_SYMBOL)
    return () if index == dictionary.unk() else (index,)
