"""What the simulated model says: tokenizers, chat templates, text, logprobs, tool-call plans.

Pure functions and small classes, deterministic under a seed.  Imports nothing from
``llmsim.api``, ``llmsim.protocol`` or ``llmsim.engine``; uses :mod:`llmsim.schema` to
generate tool-call arguments.
"""
