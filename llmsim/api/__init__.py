"""Wire formats and endpoint handlers.  Imports nothing from ``llmsim.protocol``.

One subpackage per endpoint family (``basic``, ``chat``, ``completions``,
``responses``, ``messages``), each with its ``register(router)`` and, where it has
them, its request classes (``request.py``) and exact bytes (``render.py``).  Shared at
this level: the seam with the protocol handlers (``http.py``), routing (``router.py``,
``context.py``), request structuring (``structure.py``, ``request_fields.py``), prompts
(``prompts.py``), and the one generation flow every generating family uses: a request
planned as a :class:`~llmsim.api.plan.GenerationPlan` (``plan.py``; each choice a
:class:`~llmsim.api.turns.TurnPlan`, ``turns.py``, ended by ``stops.py``), submitted as jobs
and delivered through a sink (``generation.py``), in SSE framing (``sse.py``).
"""
