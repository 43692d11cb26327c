"""Perplexity (``palm-score ppl``) from ``fairseq-generate --score-reference`` output (its per-token base-2 log
probabilities, the ``P-`` lines) or from a ``fairseq-validate`` / ``fairseq-train`` log (``valid on '...' subset``
lines)."""
import json
import re

from palm_tools.scoring import ScoreError
from palm_tools.scoring.inputs import read_generate_output, read_lines, scores_references


def perplexity_from_generate(path):
    """Token-level perplexity from ``fairseq-generate --score-reference`` output: 2 ** (-mean of all P- values),
    the end-of-sentence token included (fairseq prints the positional scores in base 2)."""
    hyps, refs, scores = read_generate_output(path)
    tokens = sum(len(s) for s in scores.values())
    if not tokens:
        raise ScoreError(f"{path} holds no P- lines: run fairseq-generate with --score-reference and without --quiet")
    if refs and not scores_references(hyps, refs):
        raise ScoreError(f"{path}: its hypotheses are not the references: this is beam-search output, whose P- lines "
                         "score the model's own hypotheses; run fairseq-generate with --score-reference")
    log2_sum = sum(sum(s) for s in scores.values())
    return {"ppl": 2 ** (-log2_sum / tokens), "tokens": tokens, "sentences": len(scores), "source": "generate"}


_VALID_LINE = re.compile(r"valid on '([^']+)' subset(.*)$")
_LOG_FIELD = re.compile(r"\|\s*([A-Za-z_0-9]+)\s+(-?[0-9.]+(?:e-?\d+)?)")


def perplexity_from_log(path, subset="valid"):
    """Perplexity from the last ``valid on '<subset>' subset`` line of a fairseq-validate or fairseq-train log
    (simple or json log format): 2 ** nll_loss when the criterion logs nll_loss (label smoothing), else 2 ** loss."""
    fields = None
    for line in read_lines(path):
        match = _VALID_LINE.search(line)
        if match and match.group(1) == subset:
            fields = {k: float(v) for k, v in _LOG_FIELD.findall(match.group(2))}
            continue
        start = line.find("{")
        if start >= 0 and f'"{subset}_loss"' in line:
            try:
                record = json.loads(line[start:])
            except json.JSONDecodeError:
                continue
            prefix = f"{subset}_"
            fields = {k[len(prefix):]: float(v) for k, v in record.items() if k.startswith(prefix)}
    if fields is None:
        raise ScoreError(f"{path} has no \"valid on '{subset}' subset\" line: is it a fairseq-validate log?")
    key = "nll_loss" if "nll_loss" in fields else "loss"
    if key not in fields:
        raise ScoreError(f"{path}: the last '{subset}' line logs no loss (it logs {', '.join(fields) or 'nothing'}); "
                         "give the log as fairseq-validate or fairseq-train wrote it")
    result = {"ppl": 2 ** fields[key], "from": key, key: fields[key], "source": "log", "subset": subset}
    if "ppl" in fields:
        result["logged_ppl"] = fields["ppl"]
    return result
