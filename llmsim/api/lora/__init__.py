"""LoRA adapters: the served adapters (``registry.py``) and the runtime load/unload
endpoints (``routes.py``)."""
