"""Which split a tree belongs to, decided by the treebank file it comes from (`wsj_SSNN.mrg`: section SS).

Splitting by file keeps each news article whole on one side: sentences of one article share names and
topics, and a test sentence whose neighbours were trained on would flatter the parser.

- `sample` (the default), for NLTK's sample of WSJ sections 00-01 (files wsj_0001-wsj_0199, 3914
  trees): files 0001-0159 train (3396 trees, 87%), 0160-0179 validate (273), 0180-0199 test (245).
  The sample is about a tenth of the paper's training data, so as much of it as possible trains; the
  two held-out parts are contiguous runs of files, as the standard sections are, and the test part is
  small enough for beam-21 decoding on a CPU while still holding ~6,000 words and ~5,000 brackets.
- `wsj`, the standard split of the full treebank, as in the paper: sections 02-21 train, 22 validate,
  23 test; the other sections (00, 01, 24) are not used.
"""

from __future__ import annotations

import re

from xspec.base.errors import UserError

SPLIT_NAMES = ("train", "valid", "test")
# Per scheme: split -> inclusive ranges of file numbers (wsj_0160 is 160; section = number // 100).
SCHEMES: dict[str, dict[str, tuple[tuple[int, int], ...]]] = {
    "sample": {"train": ((1, 159),), "valid": ((160, 179),), "test": ((180, 199),)},
    "wsj": {"train": ((200, 2199),), "valid": ((2200, 2299),), "test": ((2300, 2399),)},
}
_FILE_ID = re.compile(r"(?:.*/)?wsj_(\d{4})(?:\.mrg)?")


def file_number(file_id: str, where: str) -> int:
    """4 digits of `wsj_0160.mrg` (a path before it, or no `.mrg`, is accepted) as a number."""
    match = _FILE_ID.fullmatch(file_id.strip())
    if match is None:
        raise UserError(f"{where}: {file_id!r} is not a WSJ file id (wsj_NNNN.mrg)")
    return int(match.group(1))


def split_of(file_id: str, scheme: str, where: str) -> str | None:
    """The split `file_id` belongs to under `scheme`, or None for a file the scheme leaves out."""
    number = file_number(file_id, where)
    for name, ranges in SCHEMES[scheme].items():
        if any(first <= number <= last for first, last in ranges):
            return name
    return None


def describe(scheme: str) -> str:
    """e.g. `train wsj_0001-0159, valid wsj_0160-0179, test wsj_0180-0199`."""
    return ", ".join(f"{name} " + " ".join(f"wsj_{a:04d}-{b:04d}" for a, b in ranges)
                     for name, ranges in SCHEMES[scheme].items())
