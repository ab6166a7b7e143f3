"""The xspec compiler: parse -> resolve -> graph -> validate -> lower, one module per stage, driven by
pipeline.py (`compile_spec`); spec.py is the compiled spec the public API returns. Importing the package
imports no stage: a module that needs one constant (limits.py) does not load the whole compiler."""
