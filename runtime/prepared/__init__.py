"""Corpora prepared once into token shards (`xspec data prepare`) and read as training needs them:
format.py (the directory and its checks), lines.py (reading text in bounded memory), prepare.py
(writing a directory), examples.py (training examples over it), splits.py (a run's prepared splits)."""
