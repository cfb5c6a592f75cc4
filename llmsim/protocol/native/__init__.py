"""llmsim's own server: protocol detection, TLS, HTTP/1.1 on h11, HTTP/2 on h2, frames
(every hand-built frame in ``frames``; every use of h2's internals in ``h2_fastpath``)."""
