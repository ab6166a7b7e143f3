"""Table 3 as the paper prints it: each row's dev figures and the direction of effect §6.2 reads off it."""

from __future__ import annotations

from typing import Literal

# Table 3 of the paper (EN-DE dev set, newstest2013): (PPL, BLEU) by variant file, in the paper's row order.
PAPER_TABLE3: dict[str, tuple[float, float]] = {
    "base": (4.92, 25.8),
    "A_heads1": (5.29, 24.9), "A_heads4": (5.00, 25.5), "A_heads16": (4.91, 25.8), "A_heads32": (5.01, 25.4),
    "B_dk16": (5.16, 25.1), "B_dk32": (5.01, 25.4),
    "C_layers2": (6.11, 23.7), "C_layers4": (5.19, 25.3), "C_layers8": (4.88, 25.5),
    "C_dmodel256": (5.75, 24.5), "C_dmodel1024": (4.66, 26.0), "C_dff1024": (5.12, 25.4), "C_dff4096": (4.75, 26.2),
    "D_drop0": (5.77, 24.6), "D_drop02": (4.95, 25.5), "D_ls0": (4.67, 25.3), "D_ls02": (5.47, 25.7),
    "E_learned_positions": (4.92, 25.7),
    "big": (4.33, 26.4),
}
Effect = Literal["better", "worse", "same"]
# The paper's direction of effect of each row against base, (on dev PPL, on dev BLEU): §6.2's words where
# it has some, else Table 3's numbers (a BLEU difference of 0.1 or a PPL difference under 0.05: the same).
PAPER_DIRECTIONS: dict[str, tuple[Effect, Effect]] = {
    "A_heads1": ("worse", "worse"),         # §6.2: single-head attention is 0.9 BLEU worse than the best
    "A_heads4": ("worse", "worse"),         # Table 3: 5.00 / 25.5, slightly worse
    "A_heads16": ("same", "same"),          # Table 3: 4.91 / 25.8
    "A_heads32": ("worse", "worse"),        # §6.2: quality also drops off with too many heads
    "B_dk16": ("worse", "worse"),           # §6.2: reducing the attention key size d_k hurts model quality
    "B_dk32": ("worse", "worse"),
    "C_layers2": ("worse", "worse"),        # §6.2: bigger models are better (so smaller ones worse)
    "C_layers4": ("worse", "worse"),
    "C_layers8": ("better", "better"),      # §6.2's claim; Table 3's own BLEU for N 8 is 25.5, below base
    "C_dmodel256": ("worse", "worse"),
    "C_dmodel1024": ("better", "better"),
    "C_dff1024": ("worse", "worse"),
    "C_dff4096": ("better", "better"),
    "D_drop0": ("worse", "worse"),          # §6.2: dropout is very helpful in avoiding over-fitting
    "D_drop02": ("same", "worse"),          # Table 3: 4.95 / 25.5
    "D_ls0": ("better", "worse"),           # §5.4: label smoothing hurts perplexity, improves BLEU
    "D_ls02": ("worse", "same"),            # Table 3: 5.47 / 25.7
    "E_learned_positions": ("same", "same"),  # §6.2: nearly identical results to the base model
    "big": ("better", "better"),            # Table 3: 4.33 / 26.4
}
METRICS = ("ppl", "bleu")
LOWER_IS_BETTER = {"ppl": True, "bleu": False}
# Table 3's varied columns, in the paper's order.
COLUMNS = ("layers", "d_model", "d_ff", "heads", "d_k", "d_v", "dropout", "label_smoothing", "positions")
