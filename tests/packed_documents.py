"""The check of `data.document_boundaries = "separate"` every mixer meets: a block of packed documents
gives each document the logits it has alone, and the training step's loss is the documents' losses summed."""

import torch
import torch.nn.functional as F

from float32 import assert_close
from xspec.runtime.cache import PackedDocuments, document_numbers
from xspec.runtime.step import TrainingStep
from xspec.runtime.vocab import EOS


@torch.no_grad()
def assert_documents_kept_apart(model: torch.nn.Module, lengths: tuple[int, ...], vocab: int, seed: int) -> None:
    """Documents of `lengths` tokens (each after its EOS), random ids below `vocab`, packed into one block."""
    generator = torch.Generator().manual_seed(seed)
    documents = [torch.cat([torch.tensor([EOS]), torch.randint(4, vocab, (n,), generator=generator)])
                 for n in lengths]
    block = torch.cat(documents)[None]
    together = model.decode(block, cache=PackedDocuments(document_numbers(block, EOS)))
    apart = torch.cat([model(document[None]) for document in documents], dim=1)
    assert_close(together, apart)
    assert not torch.allclose(model(block), apart, atol=1e-3)    # read across, they differ
    labels = torch.cat([block[:, 1:], torch.tensor([[EOS]])], dim=1)
    whole = TrainingStep(model, label_smoothing=0.0, document_start=EOS)(labels, block, smoothed=False)
    starts = [sum(len(d) for d in documents[:i]) for i in range(len(documents))]
    each = sum(F.cross_entropy(model(d[None])[0], labels[0, start:start + len(d)], reduction="sum")
               for d, start in zip(documents, starts))
    assert_close(whole, each)
