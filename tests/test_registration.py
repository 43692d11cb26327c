"""Importing the plugin registers every name of the design card with fairseq's registries."""
import subprocess
import sys

from tests.conftest import REPO, USER_DIR

TASKS = {"continuation_pair", "pmlm", "unilm_pretraining", "unilm_seq2seq"}
MODELS = {"palm", "unilm"}
ARCHS = {"palm_base", "palm_large", "palm_tiny", "unilm_base", "unilm_large", "unilm2_base", "unilm_tiny",
         "unilm2_tiny"}
CRITERIA = {"palm_mlm_lm", "pmlm_ae_par", "unilm_cloze"}


def test_import_registers_everything():
    import palm_plugin  # noqa: F401
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    assert TASKS <= set(TASK_REGISTRY)
    assert MODELS <= set(MODEL_REGISTRY)
    assert ARCHS <= set(ARCH_MODEL_REGISTRY)
    assert CRITERIA <= set(CRITERION_REGISTRY)
    assert {ARCH_MODEL_REGISTRY[a].__name__ for a in ARCHS} == {MODEL_REGISTRY[m].__name__ for m in MODELS}


def test_user_dir_registers_in_a_fresh_process():
    """`--user-dir` (fairseq's own import path) finds every name; `--help` of a task documents its options."""
    code = (
        "import sys; from fairseq import options, utils; "
        f"utils.import_user_module(type('A', (), {{'user_dir': {str(USER_DIR)!r}}})()); "
        "from fairseq.tasks import TASK_REGISTRY; from fairseq.models import ARCH_MODEL_REGISTRY; "
        "from fairseq.criterions import CRITERION_REGISTRY; "
        f"missing = ({sorted(TASKS)!r}, {sorted(ARCHS)!r}, {sorted(CRITERIA)!r}); "
        "reg = (TASK_REGISTRY, ARCH_MODEL_REGISTRY, CRITERION_REGISTRY); "
        "print([n for names, r in zip(missing, reg) for n in names if n not in r])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
