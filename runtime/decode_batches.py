"""Decoding many lines in batches of similar length while the results come out in input order, as soon
as a line and every line before it are done (what streaming `xspec translate` / `xspec generate` write)."""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional, Sequence, TypeVar

T = TypeVar("T")


def length_sorted_chunks(indices: Iterable[int], lengths: Sequence[int], batch_tokens: int,
                         equal_length: bool = False) -> Iterator[list[int]]:
    """The indices sorted by length and cut into chunks of at most `batch_tokens` padded tokens
    (lines x longest; always at least one line). `equal_length`: a chunk's lines have one length, so
    they need no padding (and no mask)."""
    chunk: list[int] = []
    for i in sorted(indices, key=lambda i: lengths[i]):
        if chunk and ((len(chunk) + 1) * lengths[i] > batch_tokens
                      or (equal_length and lengths[i] != lengths[chunk[0]])):
            yield chunk
            chunk = []
        chunk.append(i)
    if chunk:
        yield chunk


def in_input_order(results: list[Optional[T]], chunks: Iterable[list[int]],
                   decode: Callable[[list[int]], Iterable[T]]) -> Iterator[list[T]]:
    """Fills `results` (None where a line is still to decode) chunk by chunk with `decode(chunk)` and,
    before the first chunk and after each, yields the results now complete from the front."""
    written = 0

    def ready() -> list[T]:
        nonlocal written
        done = written
        while done < len(results) and results[done] is not None:
            done += 1
        complete, written = results[written:done], done
        return complete  # type: ignore[return-value]  # no None before `done`

    if head := ready():
        yield head
    for chunk in chunks:
        for i, result in zip(chunk, decode(chunk)):
            results[i] = result
        if more := ready():
            yield more
