"""The built-in demo task: reproducible, 5-40 words, not solvable by copying, held-out test split."""

from xspec.runtime.demo_data import MAX_WORDS, MIN_WORDS, build_lexicon, generate_split


def test_splits_are_reproducible_and_disjoint():
    train = generate_split("train", 3000)
    assert train == generate_split("train", 3000)
    test = generate_split("test", 300)
    assert not set(test) & set(train)


def test_lengths_and_vocabulary_sizes():
    pairs = generate_split("train", 3000)
    assert all(MIN_WORDS <= len(s.split()) <= MAX_WORDS and len(t.split()) <= MAX_WORDS for s, t in pairs)
    assert max(len(s.split()) for s, _ in pairs) > 30
    source_words = {w for s, _ in pairs for w in s.split()}
    target_words = {w for _, t in pairs for w in t.split()}
    assert 300 <= len(source_words) <= 600 and 400 <= len(target_words) <= 900
    assert not source_words & target_words          # copying a source word is never right


def test_the_verb_moves_to_the_end_and_agrees_with_its_subject():
    lexicon = build_lexicon()
    verbs = dict(lexicon.verbs)                      # source stem -> target stem
    conjunctions = {source for source, _ in lexicon.conjunctions}
    checked = 0
    for source, target in generate_split("valid", 300):
        words = source.split()
        if conjunctions & set(words):
            continue                                 # one clause only: its verb ends the target
        verb = next(w for w in words if w in verbs or (w.endswith("s") and w[:-1] in verbs))
        singular = verb not in verbs                 # "-s": a singular subject
        stem = verb[:-1] if singular else verb
        assert target.split()[-1] == verbs[stem] + ("et" if singular else "ent")
        assert words.index(verb) < len(words) - 1    # in the source it is not last (an object follows)
        checked += 1
    assert checked > 100
