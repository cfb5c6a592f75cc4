/* The C twin of llmsim/protocol/native/native_h1.py:Http1Response.write: the per-token
 * write of a chunked HTTP/1.1 response.
 *
 * Taken in C: the fast case only, every condition checked as the Python code checks
 * it (chunked, STREAMING, nothing buffered, frame_at_once, the handler's batch
 * ``host._out`` empty, 0 < size < low_water, the transport not congested): the chunk
 * (size line, data, CRLF) is made in one allocation and appended to ``host._out``,
 * ``host._framed`` is set to the data and ``host._t.wake_writer()`` is called.
 * Handed to Python: everything else, by calling the pure write (http1.py:PURE_WRITE),
 * which checks again from the start and takes the take_back branch (a batch
 * not empty) or the general path (BufferedResponse.write).  The C code changes nothing
 * before it has decided, so a hand-over is exactly the pure write (and take_back runs
 * once, there).  Anything of an unexpected type (a bytes subclass, a non-int, a truth
 * value not a bool, a batch not a list, an unset slot or attribute) is handed over
 * before it is used, so no Python code (__bool__, __len__...) runs twice.
 *
 * Fields of the response (an attrs slotted class) and of its host (an Http1Handler,
 * exactly: it has __slots__) are read by slot offset; the transport's (a Connection, or
 * a test's or driver's fake) by getattr with interned names: plain attributes, so
 * reading them has no effect, and reading one again in the pure write after a hand-over
 * is not observable.
 *
 * The chunk: the size line is the size in lowercase hexadecimal, as http1_fastpath.py:
 * SIZE_LINES and frames.py:chunk write it (tests/protocol/native/
 * test_native_h1_write.py checks every size of the table and sizes above it).
 */
#include "speedups.h"

/* What install_http1_write was given (strong references) and the slot offsets of the
 * response's fields and of its host's. */
static struct {
    PyTypeObject *response; /* native_h1.py:Http1Response */
    PyObject *handler;      /* http1.py:Http1Handler */
    PyObject *pure_write;   /* http1.py:PURE_WRITE */
    PyObject *streaming;    /* ResponseState.STREAMING */
    PyObject *zero;         /* the int 0 (a small int: every 0 the interpreter makes is it) */
    Py_ssize_t chunked, state, buffered, frame_at_once, host, low_water; /* Http1Response */
    Py_ssize_t out, t, framed;                                          /* Http1Handler */
} twin;

/* Interned attribute names (made once, at module init). */
static PyObject *s_congested, *s_wake_writer;

/* speedups.h: a write to ``response`` ``ahead`` places on (any ResponseStream; only an
 * Http1Response's fields are read, once its type is checked): 2, the response; 1, its
 * Http1Handler. */
void
llmsim_prefetch_h1_write(PyObject *response, int ahead)
{
    llmsim_prefetch_link(response, ahead, twin.response, twin.host, (PyTypeObject *)twin.handler);
}

/* The outcome of the C part: done (the chunk is in the batch), hand over to the pure
 * write (nothing changed), or an exception (from wake_writer, or out of memory). */
enum { DONE = 1, HAND_OVER = 0, FAILED = -1 };

/* The response's own conditions, native_h1.py:Http1Response.write's first line: chunked,
 * STREAMING, nothing buffered (the int 0 itself), frame_at_once; and its low-water
 * mark as an exact int in *low_water.  1 when they hold; 0 otherwise. */
static int
response_is_ready(PyObject *self, Py_ssize_t *low_water)
{
    if (LLMSIM_SLOT(self, twin.chunked) != Py_True || LLMSIM_SLOT(self, twin.state) != twin.streaming
        || LLMSIM_SLOT(self, twin.buffered) != twin.zero || LLMSIM_SLOT(self, twin.frame_at_once) != Py_True) {
        return 0;
    }
    PyObject *mark = LLMSIM_SLOT(self, twin.low_water);
    if (mark == NULL || !PyLong_CheckExact(mark)) {
        return 0;
    }
    *low_water = PyLong_AsSsize_t(mark);
    if (*low_water == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* (too large: the pure write deals with it) */
        return 0;
    }
    return 1;
}

/* ``data`` as one chunk of a chunked body: frames.py:chunk, for a size > 0. */
static PyObject *
make_chunk(PyObject *data, Py_ssize_t size)
{
    static const char hex[] = "0123456789abcdef";
    char line[2 * sizeof(Py_ssize_t)];
    int digits = 0;
    for (size_t rest = (size_t)size; rest; rest >>= 4) {
        line[sizeof(line) - 1 - digits++] = hex[rest & 15];
    }
    PyObject *chunk = PyBytes_FromStringAndSize(NULL, digits + 2 + size + 2);
    if (chunk == NULL) {
        return NULL;
    }
    char *out = PyBytes_AS_STRING(chunk);
    memcpy(out, line + sizeof(line) - digits, digits);
    out += digits;
    *out++ = '\r';
    *out++ = '\n';
    memcpy(out, PyBytes_AS_STRING(data), size);
    out += size;
    *out++ = '\r';
    *out = '\n';
    return chunk;
}

/* The batch's part of the fast case, ``host._out`` (empty) and ``host._t`` read
 * (borrowed): ``not host._t.congested``, then the chunk appended, _framed set, the
 * writer woken (native_h1.py:Http1Response.write, the inner block). */
static int
frame_into_batch(PyObject *host, PyObject *out, PyObject *transport, PyObject *data, Py_ssize_t size)
{
    PyObject *congested = PyObject_GetAttr(transport, s_congested);
    if (congested == NULL) {
        PyErr_Clear(); /* (the pure write raises it again) */
        return HAND_OVER;
    }
    int free_flowing = congested == Py_False; /* (True, or not a bool: the pure write's) */
    Py_DECREF(congested);
    if (!free_flowing) {
        return HAND_OVER;
    }
    PyObject *chunk = make_chunk(data, size);
    if (chunk == NULL) {
        return FAILED;
    }
    int appended = PyList_Append(out, chunk);
    Py_DECREF(chunk);
    if (appended < 0) {
        return FAILED;
    }
    llmsim_slot_set(host, twin.framed, data);
    PyObject *woken = PyObject_VectorcallMethod(s_wake_writer, &transport, 1, NULL);
    if (woken == NULL) {
        return FAILED;
    }
    Py_DECREF(woken);
    return DONE;
}

/* The fast case of native_h1.py:Http1Response.write, or HAND_OVER before any change.
 * (``self`` is an Http1Response, or of a subclass: the method descriptor checks it, and
 * the slots of a class are where they are in its subclasses too.) */
static int
write_fast(PyObject *self, PyObject *data)
{
    Py_ssize_t low_water;
    if (!PyBytes_CheckExact(data) || !response_is_ready(self, &low_water)) {
        return HAND_OVER;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    PyObject *host = LLMSIM_SLOT(self, twin.host);
    if (host == NULL || !Py_IS_TYPE(host, (PyTypeObject *)twin.handler) || size <= 0 || size >= low_water) {
        return HAND_OVER;
    }
    PyObject *out = LLMSIM_SLOT(host, twin.out);
    PyObject *transport = LLMSIM_SLOT(host, twin.t);
    if (out == NULL || !PyList_CheckExact(out) || PyList_GET_SIZE(out) != 0 || transport == NULL) {
        return HAND_OVER; /* (a batch not empty, too: take_back is the pure write's) */
    }
    /* (Both held across the calls below: wake_writer may replace the handler's fields.) */
    Py_INCREF(out);
    Py_INCREF(transport);
    int result = frame_into_batch(host, out, transport, data, size);
    Py_DECREF(transport);
    Py_DECREF(out);
    return result;
}

/* Http1Response.write(self, data): installed as the method ``write``. */
static PyObject *
http1_write(PyObject *self, PyObject *data)
{
    int result = write_fast(self, data);
    if (result == DONE) {
        Py_RETURN_TRUE;
    }
    if (result == FAILED) {
        return NULL;
    }
    return llmsim_call_with_self(twin.pure_write, self, &data, 1, NULL);
}

static PyMethodDef write_def = {"write", (PyCFunction)http1_write, METH_O,
                                "Http1Response.write, compiled (native/h1_write.c)."};

/* install_http1_write(cls, handler, streaming, pure_write): make the twin cls.write,
 * for responses whose host is a ``handler`` (others go to pure_write). */
static PyObject *
install_http1_write(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "install_http1_write(cls, handler, streaming, pure_write)");
        return NULL;
    }
    static const char *const response_fields[6] = {"chunked", "state", "buffered", "frame_at_once", "host",
                                                    "low_water"};
    Py_ssize_t *const response_offsets[6] = {&twin.chunked, &twin.state, &twin.buffered,
                                             &twin.frame_at_once, &twin.host, &twin.low_water};
    static const char *const handler_fields[3] = {"_out", "_t", "_framed"};
    Py_ssize_t *const handler_offsets[3] = {&twin.out, &twin.t, &twin.framed};
    if (llmsim_slot_offsets(args[0], response_fields, response_offsets, 6) < 0 ||
        llmsim_slot_offsets(args[1], handler_fields, handler_offsets, 3) < 0) {
        return NULL;
    }
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {
        return NULL;
    }
    Py_XSETREF(twin.zero, zero);
    Py_XSETREF(twin.handler, Py_NewRef(args[1]));
    Py_XSETREF(twin.response, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(twin.streaming, Py_NewRef(args[2]));
    Py_XSETREF(twin.pure_write, Py_NewRef(args[3]));
    if (llmsim_install_method(args[0], &write_def) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef functions[] = {
    {"install_http1_write", (PyCFunction)(void (*)(void))install_http1_write, METH_FASTCALL,
     "install_http1_write(cls, handler, streaming, pure_write): install the C Http1Response.write on cls."},
    {NULL, NULL, 0, NULL},
};

int
llmsim_h1_init(PyObject *module)
{
    static const llmsim_name names[] = {{&s_congested, "congested"}, {&s_wake_writer, "wake_writer"}};
    if (llmsim_intern_names(names, LLMSIM_COUNT(names)) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, functions);
}
