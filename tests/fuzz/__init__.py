"""Fuzzing the compiler: generated and mutated specs, each checked against one oracle (oracle.py)."""
