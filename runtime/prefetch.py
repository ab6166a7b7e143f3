"""Preparing the next item while the current one runs, so the host does not keep a GPU waiting.

On a GPU, each update's batches are collated, pinned and copied while the previous update computes (the
copies are asynchronous); on a CPU the same work would only compete with the computation for cores, so
there it runs in line.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Generic, Iterator, Optional, TypeVar

Item = TypeVar("Item")
Prepared = TypeVar("Prepared")


class Prefetcher(Generic[Item, Prepared]):
    """Iterates `prepare(item)` over `items`, one item ahead on a background thread when `ahead`."""

    def __init__(self, items: Iterator[Item], prepare: Callable[[Item], Prepared], ahead: bool) -> None:
        self.items, self.prepare = items, prepare
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xspec-prefetch") if ahead else None
        self._next: Optional[Future] = None

    def __iter__(self) -> Iterator[Prepared]:
        executor = self._executor
        if executor is None:
            yield from map(self.prepare, self.items)
            return
        try:
            self._next = self._submit(executor)
            while self._next is not None:
                prepared = self._next.result()
                self._next = self._submit(executor)
                yield prepared
        finally:
            executor.shutdown(wait=True, cancel_futures=True)

    def _submit(self, executor: ThreadPoolExecutor) -> Optional[Future]:
        item = next(self.items, None)
        return None if item is None else executor.submit(self.prepare, item)
