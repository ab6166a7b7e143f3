"""What every layer shares: errors a user can cause (errors.py), reading and writing files (files.py), and
how a computing process runs (process.py). It imports nothing of xspec outside itself, so the compiler and
the runtime can import it without reaching into the application above them (tests/test_layers.py)."""
