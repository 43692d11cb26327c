"""Checkpoints that survive a kill.

fairseq writes the first checkpoint of a save atomically (a ``.tmp`` file, then a rename) but makes the others
(``checkpoint_last.pt``, ``checkpoint_best.pt``, ...) by copying it in place. A run killed during that copy leaves
a truncated ``checkpoint_last.pt``, and the restart that should resume from it fails. :func:`install` makes the
copy of local files atomic as well: copy to a temporary name in the same folder, then ``os.replace``.
"""
import os
import shutil


def install():
    """Patch ``fairseq.file_io.PathManager.copy`` for local files (idempotent)."""
    from fairseq.file_io import PathManager

    copy = PathManager.copy
    if getattr(copy, "__palm_plugin__", False):
        return

    def atomic_copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if PathManager.path_requires_pathmanager(dst_path) or (os.path.exists(dst_path) and not overwrite):
            return copy(src_path, dst_path, overwrite=overwrite)
        tmp_path = f"{dst_path}.tmp"
        shutil.copyfile(src_path, tmp_path)
        os.replace(tmp_path, dst_path)
        return True

    atomic_copy.__palm_plugin__ = True
    PathManager.copy = staticmethod(atomic_copy)
