"""Reading what palm-score scores.

Hypotheses and references are files with one example per line, or the output of ``fairseq-generate`` (``D-`` lines,
or ``H-`` lines when no detokenizer ran, ordered by sample id; references from its ``T-`` lines unless ``--ref``
gives the raw reference file).
"""
import re

from palm_tools.scoring import ScoreError
from palm_tools.text_files import not_utf8


def read_lines(path):
    """The lines of a UTF-8 text file without their line ends. Only ``\n`` ends a line (as for ``wc -l`` and
    fairseq), not the other separators ``str.splitlines`` knows, such as U+2028. A byte-order mark at the start
    (Windows editors write one) is not text: it is dropped, or the first line would never match its reference."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            lines = f.read().split("\n")
    except OSError as e:
        raise ScoreError(f"cannot read {path}: {e.strerror}; check the path") from e
    except UnicodeDecodeError as e:
        what, todo = not_utf8(path)
        raise ScoreError(f"{path} is {what} ({e.reason} at byte {e.start}); {todo}") from e
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


_GENERATE_LINE = re.compile(r"^([HDTP])-(\d+)\t(.*)$")


def read_generate_output(path):
    """Parse ``fairseq-generate`` output. Returns ``(hypotheses, references, positional_scores)``, each a dict from
    sample id to the first (best) entry for that id: hypothesis text (``D-`` preferred over ``H-``), reference
    text (``T-``) and the list of per-token base-2 log probabilities (``P-``)."""
    hyps, detoks, refs, scores = {}, {}, {}, {}
    for number, line in enumerate(read_lines(path), 1):
        match = _GENERATE_LINE.match(line)
        if not match:
            continue
        kind, sample_id, rest = match.group(1), int(match.group(2)), match.group(3)
        if kind == "T":
            refs.setdefault(sample_id, rest)
            continue
        if kind == "P":
            try:
                scores.setdefault(sample_id, [float(x) for x in rest.split()])
            except ValueError as e:
                raise ScoreError(f"{path}:{number}: a P- line must hold numbers: {line[:80]!r}") from e
            continue
        parts = rest.split("\t", 1)
        text = parts[1] if len(parts) == 2 else ""
        (detoks if kind == "D" else hyps).setdefault(sample_id, text)
    return (detoks or hyps), refs, scores


def scores_references(hyps, refs):
    """Whether ``fairseq-generate`` output (from :func:`read_generate_output`) came from ``--score-reference``: there
    every hypothesis is its reference (fairseq writes an unknown word ``<<unk>>`` in T- lines, ``<unk>`` in H-)."""
    shared = [i for i in hyps if i in refs]
    return bool(shared) and all(hyps[i] == refs[i].replace("<<unk>>", "<unk>") for i in shared)


def load_examples(args):
    """Hypotheses and reference streams (a list of lists, one list per reference file) from the command line."""
    if args.generate:
        by_id, generate_refs, _ = read_generate_output(args.generate)
        if not by_id:
            raise ScoreError(f"{args.generate} holds no H-/D- lines: is it the output of fairseq-generate?")
        if len(by_id) > 1 and scores_references(by_id, generate_refs):
            raise ScoreError(f"{args.generate}: every hypothesis is its reference: this is fairseq-generate "
                             "--score-reference output; score the hypotheses of a run without --score-reference")
        ids = sorted(by_id)
        hyps = [by_id[i] for i in ids]
        if args.ref:
            refs = [read_lines(path) for path in args.ref]
            for path, stream in zip(args.ref, refs):
                if ids[-1] >= len(stream):
                    raise ScoreError(f"{args.generate} has sample id {ids[-1]} but {path} has {len(stream)} lines: "
                                     "--ref must be the references of the split fairseq-generate ran on (its "
                                     "--gen-subset), one example a line")
            return hyps, [[stream[i] for i in ids] for stream in refs]
        missing = [i for i in ids if i not in generate_refs]
        if missing:
            raise ScoreError(f"{args.generate} has no T- line for sample {missing[0]}: pass the references with --ref")
        return hyps, [[generate_refs[i] for i in ids]]
    if not args.hyp or not args.ref:
        raise ScoreError("give --hyp FILE and --ref FILE, or --generate FILE (fairseq-generate output)")
    hyps = read_lines(args.hyp)
    refs = [read_lines(path) for path in args.ref]
    for path, stream in zip(args.ref, refs):
        if len(stream) != len(hyps):
            raise ScoreError(f"{args.hyp} has {len(hyps)} lines but {path} has {len(stream)}: one example a line")
    if not hyps:
        raise ScoreError(f"{args.hyp} is empty")
    return hyps, refs
