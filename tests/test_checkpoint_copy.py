"""fairseq's copies of checkpoint_last.pt / checkpoint_best.pt are atomic once the plugin is imported."""
import shutil

import pytest

import palm_plugin  # noqa: F401


def test_interrupted_copy_leaves_the_old_file_whole(tmp_path, monkeypatch):
    from fairseq.file_io import PathManager

    src, dst = tmp_path / "checkpoint_1_10.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"new" * 1000)
    dst.write_bytes(b"old checkpoint")

    def killed_midway(source, target):
        with open(target, "wb") as f:
            f.write(b"ne")
        raise KeyboardInterrupt  # stands for the process dying during the copy

    monkeypatch.setattr(shutil, "copyfile", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == b"old checkpoint"

    monkeypatch.undo()
    assert PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == src.read_bytes()
    assert not (tmp_path / "checkpoint_last.pt.tmp").exists()
