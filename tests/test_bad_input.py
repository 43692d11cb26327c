"""Bad input to the pre-training tasks stops with the file named and what to do."""
import pytest

from tests.conftest import PRETRAINING, USER_DIR
from tests.test_determinism import OURS, build_dataset


@pytest.mark.parametrize("task", OURS)
def test_missing_split_names_the_path(task, mono_data):
    import palm_plugin  # noqa: F401
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [str(mono_data), "--user-dir", str(USER_DIR),
                                                                          *PRETRAINING[task]])
    loaded = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    with pytest.raises(FileNotFoundError, match=rf"no binarized split 'nosuch' at {mono_data}/nosuch.*fairseq-preprocess"):
        loaded.load_dataset("nosuch")


@pytest.mark.parametrize("task", OURS)
def test_missing_dictionary_names_the_file(task, tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path}/dict.txt: no dictionary"):
        build_dataset(tmp_path, task, seed=1)
