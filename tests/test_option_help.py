"""`--help` of a fairseq command lists, with their help texts, the options of the task, model and criterion named
on its command line (palm_plugin/fixes/option_help.py), for every task of the plugin and for PALM fine-tuning."""
import re

import pytest

from tests.conftest import USER_DIR, run_cli

CASES = [
    ("fairseq-train", "pmlm", "unilm2_tiny", "pmlm_ae_par",
     ["--objective", "--block-prob", "--leave-unmasked-prob", "--relative-position-buckets"]),
    ("fairseq-train", "continuation_pair", "palm_tiny", "palm_mlm_lm",
     ["--split-mode", "--max-source-tokens", "--random-token-prob", "--no-copy", "--stage", "--mlm-weight"]),
    ("fairseq-train", "unilm_pretraining", "unilm_tiny", "unilm_cloze",
     ["--span-length-probs", "--objective-probs", "--num-segments", "--label-smoothing"]),
    ("fairseq-train", "translation", "palm_tiny", "label_smoothed_cross_entropy",
     ["--truncate-source", "--copy-attention-dim", "--source-position-markers"]),
    ("fairseq-generate", "unilm_seq2seq", None, None, ["--pseudo-masks", "--target-mask-prob", "--source-segment"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("tool,task,arch,criterion,expected", CASES, ids=[c[1] for c in CASES])
def test_help_lists_the_options_of_what_is_named(tool, task, arch, criterion, expected):
    args = ["--user-dir", USER_DIR, "--task", task, "--help"]
    args += ["--arch", arch] if arch else []
    args += ["--criterion", criterion] if criterion else []
    result = run_cli(tool, *args, timeout=120)  # no DATA: not required when only the help is wanted
    for option in expected:
        # the option's own line, followed by a help text (argparse puts it on the same or the next line)
        match = re.search(rf"^  {re.escape(option)}\b.*\n?\s+\S", result.stdout, flags=re.M)
        assert match, f"{option} not documented in {tool} --task {task} --help"
    assert "usage: " in result.stdout


def test_without_help_data_is_still_required():
    result = run_cli("fairseq-train", "--user-dir", USER_DIR, "--task", "pmlm", "--arch", "unilm2_tiny", "--criterion",
                     "pmlm_ae_par", check=False, timeout=120)
    assert result.returncode == 2 and "the following arguments are required: data" in result.stderr
