"""A checkpoint's token embedding must have one row per symbol of the dictionary the model is built from.

One row more than a unilm model's dictionary, which lacks ``<pseudo>``, is a UniLMv2 checkpoint under a task without
its symbol (PALM has no ``<pseudo>``: there it is another dictionary's checkpoint, as any other count is; the
reverse, a BERT-family checkpoint under a UniLMv2 task, is grown: :mod:`palm_plugin.modules.table_extension`).

Both models (``palm``, ``unilm``) call :func:`check_embedding_rows` at the end of ``upgrade_state_dict_named``,
which fairseq runs on every state dict before loading it (``fairseq-generate --path``, ``--restore-file``,
``--finetune-from-model``) and which ``--roberta-path`` runs too. Without the check, data binarized with another
dictionary than the checkpoint's ends in torch's "size mismatch" traceback, which names neither file. The model
knows neither file either: the loaders that do add them to the message (:mod:`palm_plugin.fixes.safe_loading` for
fairseq's loader, :mod:`palm_plugin.models.palm_roberta_init` for ``--roberta-path``).

A dictionary of the same size but other symbols (another corpus's dictionary, or the same one re-sorted) fits the
embedding and would train and decode in the wrong words without a word. So both models keep a record of their
dictionary, :data:`FINGERPRINT`: one hash per symbol, saved with the weights; :func:`check_symbols` compares it with
the dictionary of the model being loaded. A checkpoint without a record (fairseq's own RoBERTa, or one written
before the record existed) gets the loading model's own; ``palm-convert`` writes one.
"""
import hashlib
import logging

import torch

from palm_plugin.errors import InputError

logger = logging.getLogger(__name__)


class DictionaryMismatchError(InputError, ValueError):
    """A checkpoint was trained with another dictionary than the one the model was built from."""


def check_embedding_rows(state_dict, key, embedding, dictionary, pseudo_family=True):
    """Raise :class:`DictionaryMismatchError` when ``state_dict[key]`` (a token embedding, if present) has another
    number of rows than the model's ``embedding`` built from ``dictionary``. ``pseudo_family``: the model's family
    has checkpoints with UniLMv2's ``<pseudo>`` (unilm; not palm, whose one row more is another dictionary's)."""
    if key not in state_dict:
        return
    rows, expected = state_dict[key].size(0), embedding.num_embeddings
    if rows == expected + 1 and pseudo_family and "<pseudo>" not in dictionary:
        raise DictionaryMismatchError(
            f"the checkpoint's token embedding has {rows} rows, one more than the {expected} of this dictionary: it "
            "was trained with UniLMv2's <pseudo> symbol (pmlm, or unilm_seq2seq --pseudo-masks); add --pseudo-masks "
            "to fine-tune or decode it with unilm_seq2seq"
        )
    if rows != expected:
        raise DictionaryMismatchError(
            f"the checkpoint's token embedding has {rows} rows but the model built from this dictionary has "
            f"{expected} ({len(dictionary)} entries, <mask> {'present' if '<mask>' in dictionary else 'absent'}): "
            "the data was binarized with another dictionary than the checkpoint was trained with. Binarize it with "
            "the checkpoint's dictionary (the dictionary of the data it was trained on): fairseq-preprocess "
            "--srcdict DICT --tgtdict DICT, or --only-source --srcdict DICT for monolingual data"
        )


FINGERPRINT = "dictionary_fingerprint"  # state-dict key of the record of the dictionary's symbols


def symbol_fingerprint(dictionary) -> torch.Tensor:
    """One hash per symbol of ``dictionary``, in its order (int64). 31 bits each: fairseq's checkpoint averaging sums
    and then floor-divides integer tensors, which gives each hash back as long as the sum does not overflow."""
    hashes = [
        int.from_bytes(hashlib.blake2b(symbol.encode("utf-8"), digest_size=4).digest(), "little") >> 1
        for symbol in dictionary.symbols
    ]
    return torch.tensor(hashes, dtype=torch.long)


def differing_rows(record, dictionary):
    """The rows, of those both have, where the record ``record`` of a dictionary names another symbol than
    ``dictionary``."""
    own, record = symbol_fingerprint(dictionary), record.cpu()
    common = min(len(record), len(own))
    return (record[:common] != own[:common]).nonzero().flatten().tolist()


def check_symbols(state_dict, key, dictionary):
    """Raise :class:`DictionaryMismatchError` when the checkpoint's record ``state_dict[key]`` names other symbols
    than ``dictionary`` on the rows both have (the rows after them, ``<mask>`` or ``<pseudo>``, are the embedding
    check's concern); then the record becomes this dictionary's, which the model loads."""
    saved = state_dict.get(key)
    if saved is not None:
        differ = differing_rows(saved, dictionary)
        if differ:
            common = min(len(saved), len(dictionary))
            shown = ", ".join(f"{row} ({dictionary[row]!r} here)" for row in differ[:3])
            raise DictionaryMismatchError(
                f"the checkpoint was trained with a dictionary of other symbols: {len(differ)} of its {common} rows "
                f"name another symbol in this dictionary, the first at rows {shown}; decoded with it, every token id "
                "would mean another word. Binarize the data with the checkpoint's dictionary (the dictionary of the "
                "data it was trained on): fairseq-preprocess --srcdict DICT --tgtdict DICT, or --only-source "
                "--srcdict DICT for monolingual data"
            )
    state_dict[key] = symbol_fingerprint(dictionary)


def warn_if_unknown(text, tokens, dictionary):
    """Warn when the encoded source ``tokens`` of ``text`` hold no symbol of ``dictionary`` (the text is empty, or
    every piece is unknown: another tokenisation or language than the model's): a model answers it all the same,
    and the answer does not depend on the text."""
    known = [t for t in tokens.tolist() if t not in (dictionary.unk(), dictionary.eos(), dictionary.bos(),
                                                      dictionary.pad())]
    if known:
        return
    what = "an input is empty" if not text.strip() else f"the input {text[:60]!r} has no symbol of the dictionary"
    logger.warning(f"{what}: the output will not depend on it; check the input, and its tokenizer and BPE, which must "
                   "be the ones the model was trained with")
