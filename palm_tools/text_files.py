"""What a text file that does not decode as UTF-8 is, and the step that makes it readable.

A tool that reads text and meets bytes that are not UTF-8 must not advise ``iconv -f latin1`` for a gzip file (the
converted file is still gzip, and the next error is stranger): compressed files and UTF-16 text are recognised by
their first bytes, the rest is text in a legacy encoding.
"""
import os
import shlex

# first bytes -> (what the file is, the command that gives its text; {path} and {stem} are filled in)
SIGNATURES = (
    (b"\x1f\x8b", "gzip-compressed", "gunzip -k {path}"),
    (b"BZh", "bzip2-compressed", "bunzip2 -k {path}"),
    (b"\xfd7zXZ\x00", "xz-compressed", "unxz -k {path}"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "unzstd {path}"),
    (b"PK\x03\x04", "a zip archive", "unzip {path}"),
    (b"\xff\xfe", "UTF-16 text", "iconv -f utf-16 -t utf-8 {path} > {stem}.utf8.txt"),
    (b"\xfe\xff", "UTF-16 text", "iconv -f utf-16 -t utf-8 {path} > {stem}.utf8.txt"),
)


def not_utf8(path, head: bytes = None):
    """``(what path is, what to do)`` for a file that does not decode as UTF-8 (``head``: its first bytes, read
    from the file when not given)."""
    if head is None:
        try:
            with open(path, "rb") as handle:
                head = handle.read(8)
        except OSError:
            head = b""
    quoted, stem = shlex.quote(os.fspath(path)), shlex.quote(os.path.splitext(os.fspath(path))[0])
    for signature, what, command in SIGNATURES:
        if head.startswith(signature):
            return f"{what}, not UTF-8 text", f"first run `{command.format(path=quoted, stem=stem)}` and give the text"
    return "not valid UTF-8", (f"convert it from the encoding it was written in, e.g. `iconv -f latin1 -t utf-8 "
                              f"{quoted} > {stem}.utf8.txt`")
