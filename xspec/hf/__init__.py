"""Hugging Face checkpoints as xspec run directories and back: `xspec import` (importer.py) and
`xspec export --format hf` (export.py). config.json is mapped attribute by attribute (families/, one module
a family), the weights repacked (weight_map.py), read from checked, memory-mapped safetensors files."""
