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


def test_a_link_is_followed_and_stays_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "scores.txt"
    target.write_text("old\n")
    (tmp_path / "link.txt").symlink_to(target)
    (tmp_path / "dangling.txt").symlink_to(tmp_path / "real" / "new.txt")
    for name in ("link.txt", "dangling.txt"):
        with atomic_open(tmp_path / name) as f:
            f.write(f"{name}\n")
        assert (tmp_path / name).is_symlink() and (tmp_path / name).read_text() == f"{name}\n"
    assert target.read_text() == "link.txt\n" and (tmp_path / "real" / "new.txt").read_text() == "dangling.txt\n"
    assert sorted(os.listdir(tmp_path / "real")) == ["new.txt", "scores.txt"]  # no temporary left


def test_a_named_pipe_is_written_directly_and_its_reader_gets_everything(tmp_path):
    import threading

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received = []
    reader = threading.Thread(target=lambda: received.append(open(pipe).read()))
    reader.start()
    with atomic_open(pipe) as f:
        f.write("a line\nanother line\n")
    reader.join(timeout=10)
    assert received == ["a line\nanother line\n"]
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and os.listdir(tmp_path) == ["pipe"]


def test_a_device_is_written_directly(tmp_path):
    with atomic_open("/dev/null") as f:
        f.write("discarded\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
