/* The C twin of llmsim/protocol/native/connection.py:WriteCoalescer.release: after
 * every engine step, each connection the step wrote to sends its batch.
 *
 * On HTTP/1.1 a paced token is a batch of its own (one stream per connection), so the
 * Python of that flush ran once per token: release's loop, Connection.flush_now,
 * Http1Handler.outgoing, socket.send's wrapper (its argument parsing, the GIL let go
 * and taken back) and Http1Handler.flushed.  Taken in C: a connection in the per-token
 * case, every condition checked as the Python code checks it, before anything changes:
 *   - the Connection (exactly): not ``_sending``, no ``_backlog``, ``phase`` not
 *     CLOSING, a direct socket (exactly socket.socket, with a file descriptor);
 *   - its handler an Http1Handler (exactly), not ``finished``, whose batch ``_out``
 *     holds one non-empty bytes object (exactly: the chunk Http1Response.write made);
 *   - its response an Http1Response (exactly), STREAMING, chunked, nothing buffered
 *     (the int 0), no drained callbacks (an empty list), its end not sent;
 * so that outgoing() would return that chunk and flushed() would do nothing.  Then, as
 * flush_now does: ``_dirty`` False, ``_framed`` None, the batch emptied, the chunk sent
 * (send(2) on the socket's descriptor, non-blocking as trio made it; EINTR is retried as
 * CPython's socket.send retries it, though the signal handlers run after the flush, not
 * between the tries; any other error counts as nothing sent, as flush_now counts an
 * OSError), and what the kernel did not take goes to Connection._keep_rest (Python).
 * Handed to Python: every other connection, through its flush_now().
 */
#include "speedups.h"

#include <errno.h>
#include <sys/socket.h>

/* What install_release was given (strong references) and the slot offsets. */
static struct {
    PyTypeObject *coalescer, *connection, *handler, *response, *socket;
    PyObject *pure_release; /* WriteCoalescer.release, the pure one */
    PyObject *closing;      /* ConnectionPhase.CLOSING */
    PyObject *streaming;    /* ResponseState.STREAMING */
    PyObject *zero;         /* the int 0 */
    Py_ssize_t held, pending;                                          /* WriteCoalescer */
    Py_ssize_t sending, backlog, phase, handler_slot, direct, dirty;   /* Connection */
    Py_ssize_t response_slot, out, framed, finished;                   /* Http1Handler */
    Py_ssize_t state, chunked, buffered, drained, end_sent;            /* Http1Response */
} twin;

static PyObject *s_flush_now, *s_keep_rest;

/* The chunk to send if ``connection`` is in the per-token case (borrowed, from the
 * handler's batch), with the handler in *handler; NULL otherwise.  Changes nothing. */
static PyObject *
per_token_chunk(PyObject *connection, PyObject **handler)
{
    if (!Py_IS_TYPE(connection, twin.connection) || LLMSIM_SLOT(connection, twin.sending) != Py_False
        || LLMSIM_SLOT(connection, twin.backlog) != Py_None) {
        return NULL;
    }
    PyObject *phase = LLMSIM_SLOT(connection, twin.phase);
    PyObject *direct = LLMSIM_SLOT(connection, twin.direct);
    *handler = LLMSIM_SLOT(connection, twin.handler_slot);
    if (phase == NULL || phase == twin.closing || direct == NULL || !Py_IS_TYPE(direct, twin.socket)
        || *handler == NULL || !Py_IS_TYPE(*handler, twin.handler)
        || LLMSIM_SLOT(*handler, twin.finished) != Py_False) {
        return NULL;
    }
    PyObject *response = LLMSIM_SLOT(*handler, twin.response_slot);
    if (response == NULL || !Py_IS_TYPE(response, twin.response) || LLMSIM_SLOT(response, twin.state) != twin.streaming
        || LLMSIM_SLOT(response, twin.chunked) != Py_True || LLMSIM_SLOT(response, twin.buffered) != twin.zero
        || LLMSIM_SLOT(response, twin.end_sent) != Py_False) {
        return NULL;
    }
    PyObject *drained = LLMSIM_SLOT(response, twin.drained);
    if (drained == NULL || !PyList_CheckExact(drained) || PyList_GET_SIZE(drained) != 0) {
        return NULL;
    }
    PyObject *out = LLMSIM_SLOT(*handler, twin.out);
    if (out == NULL || !PyList_CheckExact(out) || PyList_GET_SIZE(out) != 1) {
        return NULL;
    }
    PyObject *chunk = PyList_GET_ITEM(out, 0);
    return PyBytes_CheckExact(chunk) && PyBytes_GET_SIZE(chunk) > 0 ? chunk : NULL;
}

/* What send(2) on ``fd`` takes of ``chunk``: 0 for an error (would block, the peer gone). */
static Py_ssize_t
send_chunk(int fd, PyObject *chunk)
{
    ssize_t sent;
    do {
        sent = send(fd, PyBytes_AS_STRING(chunk), (size_t)PyBytes_GET_SIZE(chunk), 0);
    } while (sent < 0 && errno == EINTR);
    return sent < 0 ? 0 : (Py_ssize_t)sent;
}

/* Flush one connection: in C if it is in the per-token case, else its flush_now().
 * 0, or -1 with an exception (from Python code: flush_now and _keep_rest catch their
 * own, so only what they let through, as release lets it through). */
static int
flush_one(PyObject *connection)
{
    PyObject *handler = NULL;
    PyObject *chunk = per_token_chunk(connection, &handler);
    int fd = -1;
    if (chunk != NULL) {
        fd = PyObject_AsFileDescriptor(LLMSIM_SLOT(connection, twin.direct));
        if (fd < 0) {
            PyErr_Clear(); /* (a closed socket: flush_now's send fails the same way) */
        }
    }
    if (fd < 0) {
        PyObject *result = PyObject_CallMethodNoArgs(connection, s_flush_now);
        Py_XDECREF(result);
        return result == NULL ? -1 : 0;
    }
    PyObject *out = LLMSIM_SLOT(handler, twin.out);
    Py_INCREF(chunk); /* (taken out of the batch) */
    llmsim_slot_set(connection, twin.dirty, Py_False);
    llmsim_slot_set(handler, twin.framed, Py_None);
    if (PyList_SetSlice(out, 0, 1, NULL) < 0) { /* (shrinks a list: cannot fail) */
        Py_DECREF(chunk);
        return -1;
    }
    Py_ssize_t sent = send_chunk(fd, chunk);
    int result = 0;
    if (sent < PyBytes_GET_SIZE(chunk)) {
        PyObject *size = PyLong_FromSsize_t(sent);
        PyObject *args[3] = {connection, chunk, size};
        PyObject *kept = size == NULL ? NULL : PyObject_VectorcallMethod(s_keep_rest, args, 3, NULL);
        Py_XDECREF(size);
        Py_XDECREF(kept);
        result = kept == NULL ? -1 : 0;
    }
    Py_DECREF(chunk);
    return result;
}

/* How many queued connections one warm pass reads ahead. */
#define WARM_WINDOW 16

/* Bring ``pending[from:from + WARM_WINDOW]``'s objects into the cache before they are
 * flushed (speedups.h, "Prefetching"): each connection's send(2) runs the loopback's
 * receive in this thread and wakes the client, and evicts what was fetched for the next
 * connections before it, so hints between sends were lost.  This reads, link by link
 * and across the window, every object the per-token checks read (the Connection; its
 * handler and socket; the handler's response and batch; the batch's chunk), with no
 * call in between, so that the misses of the window's connections overlap. */
static void
warm_window(PyObject *pending, Py_ssize_t from)
{
    PyObject *handlers[WARM_WINDOW] = {NULL}, *outs[WARM_WINDOW] = {NULL};
    Py_ssize_t count = PyList_GET_SIZE(pending) - from;
    count = count < WARM_WINDOW ? count : WARM_WINDOW;
    PyObject *const *connections = &PyList_GET_ITEM(pending, from);
    /* (An object is read past its header only once its exact type is known.) */
    for (Py_ssize_t i = 0; i < count; i++) {
        if (Py_IS_TYPE(connections[i], twin.connection)) {
            llmsim_touch(connections[i], twin.connection->tp_basicsize);
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (Py_IS_TYPE(connections[i], twin.connection)) {
            PyObject *handler = LLMSIM_SLOT(connections[i], twin.handler_slot);
            PyObject *direct = LLMSIM_SLOT(connections[i], twin.direct);
            if (handler != NULL && Py_IS_TYPE(handler, twin.handler)) {
                llmsim_touch(handler, twin.handler->tp_basicsize);
                handlers[i] = handler;
            }
            if (direct != NULL) {
                llmsim_touch(direct, sizeof(PyObject));
            }
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (handlers[i] != NULL) {
            PyObject *response = LLMSIM_SLOT(handlers[i], twin.response_slot);
            PyObject *out = LLMSIM_SLOT(handlers[i], twin.out);
            if (response != NULL && Py_IS_TYPE(response, twin.response)) {
                llmsim_touch(response, twin.response->tp_basicsize);
            }
            if (out != NULL && PyList_CheckExact(out)) {
                llmsim_touch(out, sizeof(PyListObject));
                outs[i] = out;
            }
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (outs[i] != NULL && PyList_GET_SIZE(outs[i]) > 0) {
            llmsim_touch(PyList_GET_ITEM(outs[i], 0), sizeof(PyObject));
        }
    }
}

/* WriteCoalescer.release(self) */
static PyObject *
release(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *pending = Py_IS_TYPE(self, twin.coalescer) ? LLMSIM_SLOT(self, twin.pending) : NULL;
    if (nargs != 0 || kwnames != NULL || pending == NULL || !PyList_CheckExact(pending)) {
        return llmsim_call_with_self(twin.pure_release, self, args, nargs, kwnames);
    }
    llmsim_slot_set(self, twin.held, Py_False);
    Py_INCREF(pending);
    /* As ``for connection in pending``: the length read again at every turn. */
    for (Py_ssize_t index = 0; index < PyList_GET_SIZE(pending); index++) {
        if (index % WARM_WINDOW == 0) {
            warm_window(pending, index);
        }
        PyObject *connection = Py_NewRef(PyList_GET_ITEM(pending, index));
        int flushed = flush_one(connection);
        Py_DECREF(connection);
        if (flushed < 0) {
            Py_DECREF(pending);
            return NULL;
        }
    }
    int cleared = PyList_SetSlice(pending, 0, PyList_GET_SIZE(pending), NULL);
    Py_DECREF(pending);
    if (cleared < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef release_def = {
    "release",
    (PyCFunction)(void (*)(void))release,
    METH_FASTCALL | METH_KEYWORDS,
    "WriteCoalescer.release in C (native/flush.c); the pure twin is connection.PURE_RELEASE.",
};

/* Slot offsets of ``cls``'s ``names``; the type kept (strong) in *type. */
static int
take_class(PyObject *cls, PyTypeObject **type, const char *const *names, Py_ssize_t *const *offsets, size_t count)
{
    if (llmsim_slot_offsets(cls, names, offsets, count) < 0) {
        return -1;
    }
    Py_XSETREF(*type, (PyTypeObject *)Py_NewRef(cls));
    return 0;
}

/* install_release(WriteCoalescer, Connection, Http1Handler, Http1Response, socket.socket,
 *                 closing, streaming, pure_release) */
static PyObject *
install_release(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2])
        || !PyType_Check(args[3]) || !PyType_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "install_release(WriteCoalescer, Connection, Http1Handler, Http1Response, "
                                         "socket.socket, closing, streaming, pure_release)");
        return NULL;
    }
    static const char *const coalescer_fields[] = {"held", "_pending"};
    Py_ssize_t *const coalescer_offsets[] = {&twin.held, &twin.pending};
    static const char *const connection_fields[] = {"_sending", "_backlog", "phase", "handler", "_direct", "_dirty"};
    Py_ssize_t *const connection_offsets[] = {&twin.sending, &twin.backlog,  &twin.phase,
                                              &twin.handler_slot, &twin.direct, &twin.dirty};
    static const char *const handler_fields[] = {"_response", "_out", "_framed", "finished"};
    Py_ssize_t *const handler_offsets[] = {&twin.response_slot, &twin.out, &twin.framed, &twin.finished};
    static const char *const response_fields[] = {"state", "chunked", "buffered", "drained_callbacks", "end_sent"};
    Py_ssize_t *const response_offsets[] = {&twin.state, &twin.chunked, &twin.buffered, &twin.drained,
                                            &twin.end_sent};
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL
        || take_class(args[0], &twin.coalescer, coalescer_fields, coalescer_offsets, LLMSIM_COUNT(coalescer_fields)) < 0
        || take_class(args[1], &twin.connection, connection_fields, connection_offsets,
                      LLMSIM_COUNT(connection_fields)) < 0
        || take_class(args[2], &twin.handler, handler_fields, handler_offsets, LLMSIM_COUNT(handler_fields)) < 0
        || take_class(args[3], &twin.response, response_fields, response_offsets, LLMSIM_COUNT(response_fields)) < 0) {
        Py_XDECREF(zero);
        return NULL;
    }
    Py_XSETREF(twin.zero, zero);
    Py_XSETREF(twin.socket, (PyTypeObject *)Py_NewRef(args[4]));
    Py_XSETREF(twin.closing, Py_NewRef(args[5]));
    Py_XSETREF(twin.streaming, Py_NewRef(args[6]));
    Py_XSETREF(twin.pure_release, Py_NewRef(args[7]));
    if (llmsim_install_method(args[0], &release_def) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef functions[] = {
    {"install_release", (PyCFunction)(void (*)(void))install_release, METH_FASTCALL,
     "install_release(WriteCoalescer, Connection, Http1Handler, Http1Response, socket.socket, closing, streaming, "
     "pure): make WriteCoalescer.release the C twin."},
    {NULL, NULL, 0, NULL},
};

int
llmsim_flush_init(PyObject *module)
{
    static const llmsim_name names[] = {{&s_flush_now, "flush_now"}, {&s_keep_rest, "_keep_rest"}};
    if (llmsim_intern_names(names, LLMSIM_COUNT(names)) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, functions);
}
