"""rebatch's testing kit: Hypothesis strategies, named samples and error cases, the verl baseline and
a plain-Python list model, shared by ``tests/``, the property suite, the mutants run and the CLI.

Importing this package imports neither JAX nor Hypothesis; its modules import what they need.
"""
