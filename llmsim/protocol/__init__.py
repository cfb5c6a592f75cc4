"""Connection handlers: bytes <-> :class:`~llmsim.api.http.HttpRequest` / ``ResponseStream``.

``native/`` is llmsim's own HTTP/1.1 (h11) and HTTP/2 (h2) server on trio; ``asgi/``
is the same application as an ASGI app under hypercorn.  Both talk to the API only
through its seam, :mod:`llmsim.api.http`.
"""
