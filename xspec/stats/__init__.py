"""Statistics of a compiled spec, read off its graph: the Table 3 hyperparameters, parameter counts,
FLOPs, memory, and the paper's Table 1 view (`xspec stats`; docs/stats.md)."""
