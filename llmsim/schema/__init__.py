"""JSON-schema and regex value generation, for tool-call arguments and structured output.

Self-contained: compiles a schema (or a ``pattern``) into a tree that generates values
valid against it, or refuses it with :class:`~llmsim.schema.keywords.ToolSchemaError`.
Imports nothing from the rest of llmsim but its option groups.
"""
