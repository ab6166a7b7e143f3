"""Corpora prepared once into token shards (`xspec data prepare`) and read as training needs them:
format.py (the directory and its checks), sources.py (the input formats, read in bounded memory),
lines.py (lines and what is skipped), prepare.py (writing a directory), examples.py (training examples
over it), splits.py (a run's prepared splits)."""
