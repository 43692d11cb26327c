"""palm_tools.atomic_files: outputs appear whole, with the permissions of a plain open(), or not at all."""
import os
import stat

import pytest

from palm_tools.atomic_files import atomic_open


def test_file_appears_with_the_permissions_of_open(tmp_path):
    with open(tmp_path / "plain.txt", "w"):
        pass
    with atomic_open(tmp_path / "sub" / "atomic.txt") as f:
        f.write("x\n")
        assert not (tmp_path / "sub" / "atomic.txt").exists()  # nothing under the final name while writing
    mode = stat.S_IMODE(os.stat(tmp_path / "sub" / "atomic.txt").st_mode)
    assert mode == stat.S_IMODE(os.stat(tmp_path / "plain.txt").st_mode)
    assert (tmp_path / "sub" / "atomic.txt").read_text() == "x\n"


def test_an_error_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_open(target) as f:
            f.write("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old\n" and os.listdir(tmp_path) == ["out.txt"]
