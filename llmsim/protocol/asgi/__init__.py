"""The API as an ASGI 3 application, and the hypercorn server that runs it."""
