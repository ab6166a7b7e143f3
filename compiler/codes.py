"""Every diagnostic code the compiler reports, with what it says in a line.

A diagnostic names its code (`error: ... [unknown-name]`) so that scripts and the documentation can refer
to it; Diagnostics refuses a code that is not here, and docs/diagnostics.md shows an example of each (a
test compiles them)."""

from __future__ import annotations

CODES: dict[str, str] = {
    # Text and files
    "syntax": "the text is not a spec: a token or construct the grammar does not allow here",
    "missing-import": "an imported file does not exist, cannot be read, or is named with a path",
    "import-cycle": "files import each other in a cycle",
    "import-refused": "a spec that must be self-contained (from a run or a checkpoint) imports a file",
    # Names and values
    "unknown-name": "a name that is no parameter, value, op, block, model or module here",
    "duplicate": "a name defined twice where it must be unique (a model, parameter, argument, module)",
    "reserved-name": "a name the generated code cannot use (a Python keyword, or one PyTorch or the code "
                     "needs)",
    "type": "a value of the wrong kind: a tensor where a constant is needed, a string for a number, ...",
    "value": "a constant outside what is allowed (out of range, or changing between the layers of a repeat)",
    "not-constant": "an expression that must be known when compiling is not (it reads a tensor or function)",
    "not-divisible": "a size computed by a division that does not come out whole",
    "too-large": "a number, repeat, file or model beyond the compiler's bounds (compiler/limits.py)",
    "too-deep": "nesting (of expressions, blocks or calls) beyond the compiler's bounds",
    "cycle": "parameters, or models through `extends`, that depend on themselves",
    # Blocks and calls
    "arguments": "a call with missing, unknown, repeated or surplus arguments, or an op's arguments that "
                 "contradict each other",
    "signature": "an entry block (encoder, decoder) whose arguments are not those the runtime passes",
    "missing": "something a model needs is absent: an encoder or decoder block, a block's return",
    "repeat-count": "a repeat count that is not a whole number of at least 1",
    "shared-call": "one call site that runs twice (through a function called twice), so two uses would share "
                   "its weights",
    "unused": "(warning) a value computed and never read, or a function never called",
    # The graph
    "shape": "tensors whose shapes do not fit the op, or an entry block that returns the wrong shape",
    "attention-positions": "rotary, ALiBi or a sliding window on attention whose keys are not its queries",
    "attention-fused": "fused_qkv on attention whose queries, keys and values are not one tensor",
    "decoder-attention": "decoder self-attention that is not causal, or keys that see the target's future",
    "tie": "a `tie` of something that cannot be tied (not a stack, a module with nothing learned, ...)",
    "tie-shape": "a `tie` of tensors or modules whose shapes differ",
}


def describe(code: str) -> str:
    """The line that says what `code` means."""
    return CODES[code]
