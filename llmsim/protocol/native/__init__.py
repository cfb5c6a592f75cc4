"""llmsim's own server: protocol detection, TLS, HTTP/1.1 on h11, HTTP/2 on h2, frames."""
