"""Wire formats and endpoint handlers.  Imports nothing from ``llmsim.protocol``."""
