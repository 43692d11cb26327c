"""``palm-convert``: released checkpoints (HF BERT / UniLM / MiniLM / UniLMv2, fairseq and HF RoBERTa) to the
plugin's fairseq format, and the plugin's UniLM checkpoints back to an HF BERT directory."""


class ConversionError(ValueError):
    """The input is not a checkpoint palm-convert can convert; the message names the file."""


def some_names(names, shown=5):
    """The first ``shown`` of ``names`` and how many more, for a message that could otherwise list thousands."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
