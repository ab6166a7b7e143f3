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


def test_the_demos_are_budgeted_in_steps_with_time_only_as_a_safety_net():
    """The README's main job (and the language-model demo) end at train.max_steps wherever they run:
    at the pace measured on 2 quiet cores (0.27 s an update for tiny, 0.16 s for lm), train.max_minutes
    leaves room for a machine ten times slower."""
    from pathlib import Path

    import xspec

    specs = Path(__file__).resolve().parent.parent.parent / "specs"
    for name, steps, seconds_per_update in (("tiny", 1000, 0.27), ("lm", 1500, 0.16)):
        train = xspec.compile(str(specs / f"{name}.xspec")).train
        assert train.max_steps == steps
        assert train.max_minutes * 60 >= 10 * steps * seconds_per_update
