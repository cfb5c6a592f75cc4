"""``llmsim serve --workers N``: N simulator processes behind one port.

The command's process becomes a supervisor (:mod:`llmsim.workers.supervisor`): it
reserves the port, starts N worker processes (:mod:`llmsim.workers.worker`), each a
whole simulator that binds the same port with ``SO_REUSEPORT`` so that the kernel
spreads the connections, restarts a worker that dies, and fans SIGINT/SIGTERM out to
all of them.  The workers share their metrics through small files in a directory the
supervisor made (:mod:`llmsim.workers.snapshots`), so that ``/metrics`` reports the
whole server.  docs/scaling.md says what is per worker and what is shared.

Nothing is imported here: :mod:`llmsim.app` uses :mod:`llmsim.workers.headers`, and the
supervisor imports the CLI, which imports the app.
"""
