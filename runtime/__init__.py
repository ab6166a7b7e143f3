"""The runtime: training, decoding and scoring for any compiled spec
(`xspec train/translate/generate/eval/average`).

Read in this order:
    demo_data.py    the built-in artificial language pair (no download needed)
    corpus.py       reading and checking parallel text files
    vocab.py        the shared sentencepiece vocabulary (§5.1)
    batching.py     batches by token count, grouped by length (§5.1)
    schedule.py     Adam and the warmup / inverse square root learning rate (§5.3)
    checkpoint.py   atomic, self-contained checkpoints; loading without unpickling
    distributed.py  devices and torchrun / DistributedDataParallel
    train.py        the training loop (§5) and the final test-set score
    beam_search.py  batched beam search with length penalty (§6.1)
    translation.py  translating many sentences in length-sorted batches
    documents.py    text for language models: documents packed into blocks, or a line per example
    tasks/          what translation and language modelling each add to the one training loop
    sampling.py     sampling a language model's continuations (temperature, top-k, top-p)
    generation.py   continuing many prompts in batches
    scoring.py      log-probabilities and perplexity
    unigram.py      the perplexity a model that knows only token frequencies reaches
    inference.py    loading a run or checkpoint for use (xspec.load)
    evaluate.py     sacreBLEU BLEU and chrF
    average.py      checkpoint averaging (§6.1)
    run_dir.py      the layout of a run directory
"""
