"""``palm-score``: the metrics the papers report (ROUGE, BLEU, ROUGE-L, answer F1, METEOR, perplexity). Text only:
nothing here imports fairseq or torch."""


class ScoreError(Exception):
    """Bad input for a metric: the message names the file and what is wrong."""
