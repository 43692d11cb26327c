"""A checkpoint's token embedding must have one row per symbol of the dictionary the model is built from.

One row more than the dictionary, which lacks ``<pseudo>``, is a UniLMv2 checkpoint under a task without its symbol
(the reverse, a BERT-family checkpoint under a UniLMv2 task, is grown: :mod:`palm_plugin.modules.table_extension`).

Both models (``palm``, ``unilm``) call :func:`check_embedding_rows` at the end of ``upgrade_state_dict_named``,
which fairseq runs on every state dict before loading it (``fairseq-generate --path``, ``--restore-file``,
``--finetune-from-model``) and which ``--roberta-path`` runs too. Without the check, data binarized with another
dictionary than the checkpoint's ends in torch's "size mismatch" traceback, which names neither file. The model
knows neither file either: the loaders that do add them to the message (:mod:`palm_plugin.fixes.safe_loading` for
fairseq's loader, :mod:`palm_plugin.models.palm_roberta_init` for ``--roberta-path``).
"""


class DictionaryMismatchError(ValueError):
    """A checkpoint was trained with another dictionary than the one the model was built from."""


def check_embedding_rows(state_dict, key, embedding, dictionary):
    """Raise :class:`DictionaryMismatchError` when ``state_dict[key]`` (a token embedding, if present) has another
    number of rows than the model's ``embedding`` built from ``dictionary``."""
    if key not in state_dict:
        return
    rows, expected = state_dict[key].size(0), embedding.num_embeddings
    if rows == expected + 1 and "<pseudo>" not in dictionary:
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
