"""Translation (§5-6): aligned source and target files, a vocabulary shared by both sides, and at the
end beam search on the test split scored with sacreBLEU."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterable, Optional

import torch

from xspec.base.errors import UserError
from xspec.base.files import write_atomically
from ..corpus import ParallelText, encode_pairs, read_parallel
from ..demo_data import write_demo_data
from ..distributed import Context
from ..evaluate import score
from ..prepared.format import PreparedDir
from ..prepared.splits import check_run_vocabulary, decoded_pairs, shared_vocabulary, train_pairs
from ..run_dir import DATA_DIR, TEST_OUTPUT, DataFiles, Split
from . import Corpus, Outcome, SplitReader, max_sequence_tokens
from ..translation import Translator, output_start
from ..vocab import Vocab


class Translation(SplitReader):
    kind = "translation"
    prepared_kind = "parallel"
    texts: dict[str, ParallelText]      # each split read, as text

    def __init__(self, spec) -> None:
        super().__init__()
        self.spec = spec
        self.start = output_start(spec.decode)     # the token a target starts from

    def demo_files(self, run_dir: Path) -> DataFiles:
        """The built-in language pair, generated into the run directory."""
        d = run_dir / DATA_DIR
        write_demo_data(d)
        return DataFiles(*(Split(d / f"{s}.src", d / f"{s}.tgt") for s in ("train", "valid", "test")))

    def decoded(self, dirs: list[PreparedDir]) -> ParallelText:
        source, target = decoded_pairs(dirs)
        return ParallelText(source, target, list(range(1, len(source) + 1)), dirs[0].path)

    def read_plain(self, name: str, split: Split) -> ParallelText:
        if split.tgt is None:
            raise UserError(f"{split.src}: a translation model trains on aligned source and target files "
                            f"(--{name}-src and --{name}-tgt), not one text file")
        return read_parallel(split.src, split.tgt)

    def vocab_text(self) -> Iterable[str]:
        train = self.texts["train"]
        return itertools.chain(train.source, train.target)

    def prepared_vocab(self) -> Optional[tuple[Path, bytes]]:
        return shared_vocabulary(self.prepared)

    def encode(self, vocab: Vocab, truncate: bool, vocab_path: str = "") -> Corpus:
        limit = max_sequence_tokens(self.spec)
        # The languages a multilingual checkpoint's tokenizer frames the targets and the sources in.
        languages = {"language": self.spec.decode.forced_bos, "source_language": self.spec.decode.source_code}
        if "train" in self.prepared:
            check_run_vocabulary(self.prepared, vocab, vocab_path)
            train = train_pairs(self.prepared["train"], self.weights, limit, truncate)
        else:
            train = encode_pairs(self.texts["train"], vocab, limit, truncate, self.start, **languages)
            if not len(train):
                raise UserError(f"{self.texts['train'].source_path}: every sentence is longer than {limit} tokens; "
                                "raise data.max_tokens or pass --truncate")
        # Validation loss covers every sentence (truncated if need be).
        valid = encode_pairs(self.texts["valid"], vocab, limit, truncate=True, start=self.start, **languages) \
            if "valid" in self.texts else None
        return Corpus(train, valid)

    def validation_bleu(self, model: torch.nn.Module, vocab: Vocab, device: torch.device) -> float:
        """train.validate_bleu: the validation split translated with the spec's decode settings, scored
        with sacreBLEU."""
        valid = self.texts["valid"]
        translator = Translator(model, vocab, self.spec.decode, device, max_sequence_tokens(self.spec))
        return score(translator.translate(valid.source), valid.target).bleu

    def evaluate(self, model: torch.nn.Module, vocab: Vocab, context: Context, run_dir: Path,
                 progress: bool) -> Optional[Outcome]:
        """§6.1: beam search on the test split (or the validation split when there is none, said so), scored with
        sacreBLEU; the translations go to RUN/test.hyp."""
        test = self.texts.get("test", self.texts.get("valid"))
        if test is None:
            return None
        translator = Translator(model, vocab, self.spec.decode, context.device, max_sequence_tokens(self.spec))
        hypotheses = translator.translate(test.source, progress=progress)
        write_atomically(run_dir / TEST_OUTPUT, "".join(h + "\n" for h in hypotheses))
        scores = score(hypotheses, test.target)
        split = "test" if "test" in self.texts else "validation"
        metrics = {"bleu": round(scores.bleu, 2), "chrf": round(scores.chrf, 2), "bleu_signature": scores.bleu_line,
                   "chrf_signature": scores.chrf_line, "scored_on": split}
        said = [] if split == "test" else ["scored on the validation split (no test split given)"]
        return Outcome(metrics, [*said, scores.chrf_line, scores.bleu_line])
