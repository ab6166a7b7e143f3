"""The built-in demo task: a seeded artificial language pair, so `xspec train` needs no download.
A language model's demo text is the source side: English-like sentences (`write_demo_text`).

The source language is English-like (subject-verb-object, adjectives before the noun, plural by
suffix). The target language differs in ways a model has to learn rather than copy:

- every word is a different token (a fixed random lexicon maps source stems to target stems);
- word order: the verb moves to the end of its clause (SOV), adjectives follow the noun in reverse order;
- agreement: determiners inflect for definiteness, gender, number and case; adjectives for the noun's
  gender and number; nouns take a gender-specific plural; verbs agree in number with their subject.

Sentences have 5-40 words. The language (lexicon, genders) is fixed by `LANGUAGE_SEED`; the splits
are sampled with their own seeds, so they are reproducible and disjoint in seed space.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from xspec.base.files import write_atomically

LANGUAGE_SEED = 2017
SPLIT_SIZES = {"train": 40_000, "valid": 300, "test": 500}
MIN_WORDS, MAX_WORDS = 5, 40

_SOURCE_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
_TARGET_SYLLABLES = [c + v for c in ["sch", "ch", "w", "h", "j", "kr", "pf", "st", "tr", "x", "q", "y"]
                     for v in ["a", "e", "i", "o", "u", "ei", "au"]]
GENDERS = ("m", "f", "n")


@dataclass(frozen=True)
class Noun:
    source: str
    target: str
    gender: str


@dataclass(frozen=True)
class Lexicon:
    nouns: list[Noun]
    adjectives: list[tuple[str, str]]      # (source, target stem)
    verbs: list[tuple[str, str]]
    prepositions: list[tuple[str, str]]
    conjunctions: list[tuple[str, str]]
    # target determiner by (definite, gender, plural, nominative)
    determiners: dict[tuple[bool, str, bool, bool], str]


def _words(rng: random.Random, syllables: list[str], count: int, taken: set[str]) -> list[str]:
    words: list[str] = []
    while len(words) < count:
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(2, 3)))
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


def build_lexicon(seed: int = LANGUAGE_SEED) -> Lexicon:
    rng = random.Random(seed)
    src_taken: set[str] = {"the", "a", "some"}
    tgt_taken: set[str] = set()

    def pairs(count: int) -> list[tuple[str, str]]:
        return list(zip(_words(rng, _SOURCE_SYLLABLES, count, src_taken),
                        _words(rng, _TARGET_SYLLABLES, count, tgt_taken)))

    nouns = [Noun(s, t, rng.choice(GENDERS)) for s, t in pairs(150)]
    adjectives, verbs = pairs(50), pairs(60)
    prepositions, conjunctions = pairs(12), pairs(3)
    forms = _words(rng, _TARGET_SYLLABLES[:30], 24, tgt_taken)
    keys = [(d, g, p, n) for d in (True, False) for g in GENDERS for p in (False, True) for n in (True, False)]
    return Lexicon(nouns, adjectives, verbs, prepositions, conjunctions, dict(zip(keys, forms)))


_PLURAL_SUFFIX = {"m": "en", "f": "ar", "n": "i"}
_ADJECTIVE_SUFFIX = {("m", False): "o", ("f", False): "a", ("n", False): "u",
                     ("m", True): "os", ("f", True): "as", ("n", True): "us"}


class _SentenceSampler:
    def __init__(self, lexicon: Lexicon, rng: random.Random) -> None:
        self.lex, self.rng = lexicon, rng

    def noun_phrase(self, nominative: bool) -> tuple[list[str], list[str], bool]:
        rng, lex = self.rng, self.lex
        noun = rng.choice(lex.nouns)
        plural, definite = rng.random() < 0.35, rng.random() < 0.6
        adjectives = rng.sample(lex.adjectives, k=rng.choice((0, 0, 1, 1, 2)))
        article = "the" if definite else ("some" if plural else "a")
        source = [article] + [s for s, _ in adjectives] + [noun.source + ("s" if plural else "")]
        target_noun = noun.target + (_PLURAL_SUFFIX[noun.gender] if plural else "")
        target_adjectives = [t + _ADJECTIVE_SUFFIX[(noun.gender, plural)] for _, t in reversed(adjectives)]
        target = [lex.determiners[(definite, noun.gender, plural, nominative)], target_noun] + target_adjectives
        return source, target, plural

    def clause(self) -> tuple[list[str], list[str]]:
        rng = self.rng
        subject_src, subject_tgt, plural = self.noun_phrase(nominative=True)
        object_src, object_tgt, _ = self.noun_phrase(nominative=False)
        verb_src, verb_tgt = rng.choice(self.lex.verbs)
        source = subject_src + [verb_src + ("" if plural else "s")] + object_src
        target = subject_tgt + object_tgt
        for _ in range(rng.choice((0, 0, 1, 1, 2))):
            prep_src, prep_tgt = rng.choice(self.lex.prepositions)
            np_src, np_tgt, _ = self.noun_phrase(nominative=False)
            source += [prep_src] + np_src
            target += [prep_tgt] + np_tgt
        target.append(verb_tgt + ("ent" if plural else "et"))   # verb-final, agreeing with the subject
        return source, target

    def sentence(self) -> tuple[str, str]:
        while True:
            source, target = self.clause()
            for _ in range(self.rng.choices((0, 1, 2), weights=(6, 3, 1))[0]):
                conj_src, conj_tgt = self.rng.choice(self.lex.conjunctions)
                clause_src, clause_tgt = self.clause()
                source += [conj_src] + clause_src
                target += [conj_tgt] + clause_tgt
            if MIN_WORDS <= len(source) <= MAX_WORDS and len(target) <= MAX_WORDS:
                return " ".join(source), " ".join(target)


def generate_split(split: str, size: int | None = None) -> list[tuple[str, str]]:
    """Sentence pairs of one split; the same every time."""
    seed = {"train": 1, "valid": 2, "test": 3}[split]
    sampler = _SentenceSampler(build_lexicon(), random.Random(LANGUAGE_SEED * 10 + seed))
    return [sampler.sentence() for _ in range(size if size is not None else SPLIT_SIZES[split])]


def write_demo_data(directory: Path, sizes: dict[str, int] | None = None) -> dict[str, tuple[Path, Path]]:
    """Writes `{split}.src` / `{split}.tgt` under `directory` (once); returns the paths by split."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, default_size in SPLIT_SIZES.items():
        src, tgt = directory / f"{split}.src", directory / f"{split}.tgt"
        if not (src.exists() and tgt.exists()):
            pairs = generate_split(split, (sizes or {}).get(split, default_size))
            write_atomically(src, "".join(s + "\n" for s, _ in pairs))
            write_atomically(tgt, "".join(t + "\n" for _, t in pairs))
        paths[split] = (src, tgt)
    return paths


def write_demo_text(directory: Path, sizes: dict[str, int] | None = None) -> dict[str, Path]:
    """Writes `{split}.txt` (the source language's sentences, one a line) under `directory` (once);
    returns the paths by split."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, default_size in SPLIT_SIZES.items():
        path = directory / f"{split}.txt"
        if not path.exists():
            pairs = generate_split(split, (sizes or {}).get(split, default_size))
            write_atomically(path, "".join(s + "\n" for s, _ in pairs))
        paths[split] = path
    return paths
