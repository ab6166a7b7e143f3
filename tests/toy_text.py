"""The small language the tokenizer tests train their vocabularies on and translate: twenty words, and lines
of them."""

WORDS = ["the", "house", "is", "small", "big", "a", "dog", "runs", "fast", "green", "tree", "under", "we", "see",
         "it", "and", "river", "old", "new", "city"]
LINES = ["the house is small", "we see a green tree under the old city", "dog", "it runs fast and the river is new",
         "a big dog and a small dog"]
