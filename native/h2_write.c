/* The C twin of llmsim/protocol/native/h2_stream.py:Http2Stream.write, with
 * h2_fastpath.py:send_data_now inlined: the per-token write of an HTTP/2 response.
 *
 * Taken in C: the fast case only, every condition checked as the Python code checks
 * it (a bytes token, h2's stream and connection state machines where send_data_now
 * needs them, both flow-control windows, the peer's frame size, the low-water rule with
 * framed/framed_batch, frame_at_once, congested, head_only), the windows reduced, the
 * DATA frame appended to the handler's batch (``host._frames``), framed/framed_batch
 * set, and the writer woken for the first frame of a batch.
 * Handed to Python: everything else, by calling the pure write (PURE_WRITE, kept in
 * http2.py), which checks again from the start and takes the general path
 * (BufferedResponse.write).  The C code changes nothing before it has decided, so a
 * hand-over is exactly the pure write.  Anything of an unexpected type (a bytes
 * subclass, a non-int window, an unset slot, a truth value not a bool or int) is handed
 * over before it is used, so no Python code (__bool__, __eq__...) runs twice.
 *
 * The fields of the stream (an attrs slotted class) and of its handler (Http2Handler
 * and its base Http2Output have __slots__ for this) are read by slot offset, and so are
 * h2's: the connection is a ServerConnection and the stream a RequestStream, with their
 * state machines, whose few fields read here are slots (h2_objects.py says how; any
 * other object is handed over).  The transport's ``congested`` is read by getattr with
 * an interned name: a plain attribute, so reading it has no effect, and reading it again
 * in the pure write after a hand-over is not observable.
 *
 * The frame: the 9-byte header and the payload are one bytes object (one allocation
 * and one list item instead of two).  Nothing reads ``host._frames`` item by item:
 * h2_output.py:Http2Output.outgoing joins the list (b"".join), and nothing else looks
 * at it but ``not frames`` (empty or not, the same either way).
 */
#include "speedups.h"

/* What install_http2_write was given (strong references) and the slot offsets of the
 * stream's fields and of the handler's (Http2Handler and Http2Output have __slots__). */
static struct {
    PyTypeObject *stream_class;   /* h2_stream.py:Http2Stream */
    PyObject *handler_class;      /* http2.py:Http2Handler */
    PyObject *pure_write;         /* http2.py:PURE_WRITE */
    PyObject *streaming;          /* ResponseState.STREAMING */
    PyObject *stream_open;        /* h2's StreamState.OPEN */
    PyObject *half_closed_remote; /* h2's StreamState.HALF_CLOSED_REMOTE */
    PyObject *server_open;        /* h2's ConnectionState.SERVER_OPEN */
    Py_ssize_t h2stream, state, buffered, queued, host, framed, framed_batch, low_water, frame_at_once,
        head_only;
    Py_ssize_t batch, transport, frames, conn; /* the handler's _batch, _t, _frames, _h2 */
} twin;

/* What install_h2_objects was given: h2's objects as h2_objects.py and h2_fastpath.py
 * make them, and the offsets of the slots read here. */
static struct {
    PyTypeObject *stream_class, *stream_machine_class, *connection_class, *connection_machine_class;
    Py_ssize_t stream_machine, stream_id, stream_window; /* RequestStream */
    Py_ssize_t stream_state;                             /* StreamMachine */
    Py_ssize_t connection_machine, connection_window, max_frame; /* ServerConnection */
    Py_ssize_t connection_state;                                  /* ConnectionMachine */
} h2;

/* Interned attribute names (made once, at module init). */
static PyObject *s_t, *s_congested, *s_wake_writer;

/* speedups.h: a write to ``response`` ``ahead`` places on (any ResponseStream; only an
 * Http2Stream's fields are read, once its type is checked): 2, the stream; 1, h2's
 * RequestStream of it. */
void
llmsim_prefetch_h2_write(PyObject *response, int ahead)
{
    llmsim_prefetch_link(response, ahead, twin.stream_class, twin.h2stream, h2.stream_class);
}

/* The outcome of the C part: done (the frame is in the batch), hand over to the pure
 * write (nothing changed), or an exception (from wake_writer, or out of memory). */
enum { DONE = 1, HAND_OVER = 0, FAILED = -1 };

/* The truth of a bool or an exact int (no Python code runs): 1 or 0; -1 otherwise. */
static int
plain_truth(PyObject *value)
{
    if (value == Py_True) {
        return 1;
    }
    if (value == Py_False) {
        return 0;
    }
    return PyLong_CheckExact(value) ? PyObject_IsTrue(value) : -1;
}

/* An exact int that fits a Py_ssize_t: 1 and *out set; 0 otherwise (no exception). */
static int
plain_int(PyObject *value, Py_ssize_t *out)
{
    if (value == NULL || !PyLong_CheckExact(value)) {
        return 0;
    }
    *out = PyLong_AsSsize_t(value);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* (too large: the pure write deals with it) */
        return 0;
    }
    return 1;
}

/* The state of ``machine``, a slot of ``owner`` of type ``machine_class`` (borrowed;
 * NULL when either is unset or of another type: the pure write takes it). */
static PyObject *
machine_state(PyObject *owner, Py_ssize_t machine_offset, PyTypeObject *machine_class, Py_ssize_t state_offset)
{
    PyObject *machine = LLMSIM_SLOT(owner, machine_offset);
    if (machine == NULL || !PyObject_TypeCheck(machine, machine_class)) {
        return NULL;
    }
    return LLMSIM_SLOT(machine, state_offset);
}

/* The window slot at ``offset`` of ``obj`` = old - size (a new int): 0, or -1 (no memory). */
static int
set_window(PyObject *obj, Py_ssize_t offset, Py_ssize_t old, Py_ssize_t size)
{
    PyObject *value = PyLong_FromSsize_t(old - size);
    if (value == NULL) {
        return -1;
    }
    llmsim_slot_set(obj, offset, value);
    Py_DECREF(value);
    return 0;
}

/* The DATA frame (no flags) of ``data`` on stream ``sid``, header and payload in one
 * bytes object: h2_fastpath.py:_PACK_DATA_HEADER(size, sid) (or _PACK_HEADER(size >> 8,
 * size & 0xFF, 0, 0, sid) from 64 KiB on: the same 9 bytes) followed by ``data``. */
static PyObject *
data_frame(PyObject *data, Py_ssize_t size, Py_ssize_t sid)
{
    PyObject *frame = PyBytes_FromStringAndSize(NULL, 9 + size);
    if (frame == NULL) {
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(frame);
    out[0] = (unsigned char)(size >> 16);
    out[1] = (unsigned char)(size >> 8);
    out[2] = (unsigned char)size;
    out[3] = 0; /* DATA */
    out[4] = 0; /* no flags */
    out[5] = (unsigned char)(sid >> 24);
    out[6] = (unsigned char)(sid >> 16);
    out[7] = (unsigned char)(sid >> 8);
    out[8] = (unsigned char)sid;
    memcpy(out + 9, PyBytes_AS_STRING(data), (size_t)size);
    return frame;
}

/* Whether ``conn`` and ``h2stream`` are h2's objects with the slots read here
 * (install_h2_objects was called, and they are of its classes). */
static int
slotted_h2(PyObject *conn, PyObject *h2stream)
{
    return h2.stream_class != NULL && PyObject_TypeCheck(h2stream, h2.stream_class)
           && PyObject_TypeCheck(conn, h2.connection_class);
}

/* h2_fastpath.py:send_data_now, from its checks on: DONE (windows reduced, the frame
 * appended to ``frames``), HAND_OVER (nothing changed) or FAILED. */
static int
send_data_now(PyObject *frames, PyObject *conn, PyObject *h2stream, PyObject *data, Py_ssize_t size)
{
    if (!slotted_h2(conn, h2stream)) {
        return HAND_OVER;
    }
    PyObject *stream_state = machine_state(h2stream, h2.stream_machine, h2.stream_machine_class, h2.stream_state);
    PyObject *connection_state =
        machine_state(conn, h2.connection_machine, h2.connection_machine_class, h2.connection_state);
    Py_ssize_t max_frame, conn_window, stream_window, sid;
    if (!((stream_state == twin.half_closed_remote || stream_state == twin.stream_open)
          && plain_int(LLMSIM_SLOT(conn, h2.max_frame), &max_frame) && size <= max_frame
          && plain_int(LLMSIM_SLOT(conn, h2.connection_window), &conn_window) && size <= conn_window
          && plain_int(LLMSIM_SLOT(h2stream, h2.stream_window), &stream_window) && size <= stream_window
          && connection_state == twin.server_open)) {
        return HAND_OVER;
    }
    /* What struct.pack takes (a length under 2**24, a 32-bit stream id); the pure write
     * raises its struct.error for anything else (after the windows, as there). */
    if (!plain_int(LLMSIM_SLOT(h2stream, h2.stream_id), &sid) || sid < 0 || sid > (Py_ssize_t)0xFFFFFFFF
        || size >= ((Py_ssize_t)1 << 24)) {
        return HAND_OVER;
    }
    if (set_window(conn, h2.connection_window, conn_window, size) < 0
        || set_window(h2stream, h2.stream_window, stream_window, size) < 0) {
        return FAILED;
    }
    PyObject *frame = data_frame(data, size, sid);
    if (frame == NULL) {
        return FAILED;
    }
    int result = PyList_Append(frames, frame);
    Py_DECREF(frame);
    return result < 0 ? FAILED : DONE;
}

/* framed = (self.framed if self.framed_batch == batch else 0) + size; 1 and *framed
 * set if framed < self.low_water, 0 otherwise (or anything not an exact int). */
static int
below_low_water(PyObject *self, PyObject *batch, Py_ssize_t size, Py_ssize_t *framed)
{
    Py_ssize_t framed_batch, batch_number, low_water;
    if (!plain_int(LLMSIM_SLOT(self, twin.framed_batch), &framed_batch) || !plain_int(batch, &batch_number)) {
        return 0;
    }
    *framed = 0;
    if (framed_batch == batch_number && !plain_int(LLMSIM_SLOT(self, twin.framed), framed)) {
        return 0;
    }
    *framed += size;
    return plain_int(LLMSIM_SLOT(self, twin.low_water), &low_water) && *framed < low_water;
}

/* self.frame_at_once and not host._t.congested and not self.head_only: 1 or 0 (0 also
 * for anything but a bool or an int, and a failed lookup, with no exception left). */
static int
may_frame_now(PyObject *self, PyObject *host)
{
    PyObject *at_once = LLMSIM_SLOT(self, twin.frame_at_once), *head_only = LLMSIM_SLOT(self, twin.head_only);
    PyObject *transport = LLMSIM_SLOT(host, twin.transport);
    if (at_once == NULL || plain_truth(at_once) != 1 || transport == NULL) {
        return 0;
    }
    PyObject *congested = PyObject_GetAttr(transport, s_congested);
    int is_congested = congested == NULL ? -1 : plain_truth(congested);
    Py_XDECREF(congested);
    if (is_congested != 0) {
        PyErr_Clear(); /* (if the lookup failed: the pure write raises it again) */
        return 0;
    }
    return head_only != NULL && plain_truth(head_only) == 0;
}

/* host._t.wake_writer() (host._t read again, as there): 0, or -1 with its exception. */
static int
wake_writer(PyObject *host)
{
    PyObject *transport = LLMSIM_SLOT(host, twin.transport);
    if (transport == NULL) { /* (unset since: the AttributeError the pure write would raise) */
        transport = PyObject_GetAttr(host, s_t);
        if (transport == NULL) {
            return -1;
        }
    }
    else {
        Py_INCREF(transport);
    }
    PyObject *woken = PyObject_CallMethodNoArgs(transport, s_wake_writer);
    Py_DECREF(transport);
    Py_XDECREF(woken);
    return woken == NULL ? -1 : 0;
}

/* self.framed, self.framed_batch = framed, batch; then, for the batch's first frame,
 * host._t.wake_writer(): DONE, or FAILED with its exception. */
static int
framed_now(PyObject *self, PyObject *host, PyObject *batch, Py_ssize_t framed, int first)
{
    PyObject *framed_value = PyLong_FromSsize_t(framed);
    if (framed_value == NULL) {
        return FAILED;
    }
    llmsim_slot_set(self, twin.framed, framed_value);
    Py_DECREF(framed_value);
    llmsim_slot_set(self, twin.framed_batch, batch);
    return first && wake_writer(host) < 0 ? FAILED : DONE;
}

/* h2_stream.py:Http2Stream.write, from ``host = self.host`` on (host an Http2Handler): the
 * low-water rule, frame_at_once, congested, head_only, then send_data_now (DONE,
 * HAND_OVER or FAILED). */
static int
write_at_once(PyObject *self, PyObject *host, PyObject *h2stream, PyObject *data, Py_ssize_t size)
{
    PyObject *batch = LLMSIM_SLOT(host, twin.batch), *frames = LLMSIM_SLOT(host, twin.frames);
    PyObject *conn = LLMSIM_SLOT(host, twin.conn);
    Py_ssize_t framed;
    if (batch == NULL || !below_low_water(self, batch, size, &framed) || !may_frame_now(self, host)) {
        return HAND_OVER;
    }
    /* frames = host._frames; first = not frames; send_data_now(frames, host._h2, h2stream, data) */
    if (frames == NULL || !PyList_CheckExact(frames) || conn == NULL) {
        return HAND_OVER;
    }
    int first = PyList_GET_SIZE(frames) == 0;
    /* (held, as the Python locals are, until the end) */
    Py_INCREF(batch);
    Py_INCREF(frames);
    Py_INCREF(conn);
    int outcome = send_data_now(frames, conn, h2stream, data, size);
    if (outcome == DONE) {
        outcome = framed_now(self, host, batch, framed, first);
    }
    Py_DECREF(conn);
    Py_DECREF(frames);
    Py_DECREF(batch);
    return outcome;
}

/* h2_stream.py:Http2Stream.write's first test: a bytes token, the head sent (h2stream),
 * STREAMING, nothing buffered or queued; then write_at_once. */
static int
write_token(PyObject *self, PyObject *data)
{
    PyObject *h2stream = LLMSIM_SLOT(self, twin.h2stream), *host = LLMSIM_SLOT(self, twin.host);
    if (h2stream == NULL || h2stream == Py_None || host == NULL || !PyBytes_CheckExact(data)
        || !PyObject_TypeCheck(host, (PyTypeObject *)twin.handler_class)) {
        return HAND_OVER;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    PyObject *buffered = LLMSIM_SLOT(self, twin.buffered), *queued = LLMSIM_SLOT(self, twin.queued);
    if (size == 0 || LLMSIM_SLOT(self, twin.state) != twin.streaming || buffered == NULL
        || plain_truth(buffered) != 0 || queued == NULL || plain_truth(queued) != 0) {
        return HAND_OVER;
    }
    /* (held: wake_writer, or a finalizer run by an allocation, may replace the slots) */
    Py_INCREF(h2stream);
    Py_INCREF(host);
    int outcome = write_at_once(self, host, h2stream, data, size);
    Py_DECREF(host);
    Py_DECREF(h2stream);
    return outcome;
}

/* Http2Stream.write(self, data) (METH_O: installed as a method of Http2Stream). */
static PyObject *
http2_write(PyObject *self, PyObject *data)
{
    int outcome = write_token(self, data);
    if (outcome == DONE) {
        Py_RETURN_TRUE;
    }
    if (outcome == FAILED) {
        return NULL;
    }
    return llmsim_call_with_self(twin.pure_write, self, &data, 1, NULL);
}

static PyMethodDef write_def = {
    "write", http2_write, METH_O,
    "Http2Stream.write, compiled (native/h2_write.c); http2.PURE_WRITE is the reference.",
};

/* install_http2_write(stream_class, handler_class, pure_write, streaming, stream_open,
 * half_closed_remote, server_open): called once by http2.py. */
static PyObject *
install_http2_write(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    static const char *const stream_fields[] = {"h2stream", "state", "buffered", "queued", "host", "framed",
                                                "framed_batch", "low_water", "frame_at_once", "head_only"};
    Py_ssize_t *const stream_offsets[] = {&twin.h2stream, &twin.state, &twin.buffered, &twin.queued,
                                          &twin.host, &twin.framed, &twin.framed_batch, &twin.low_water,
                                          &twin.frame_at_once, &twin.head_only};
    static const char *const handler_fields[] = {"_batch", "_t", "_frames", "_h2"};
    Py_ssize_t *const handler_offsets[] = {&twin.batch, &twin.transport, &twin.frames, &twin.conn};
    if (nargs != 7 || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "install_http2_write(stream_class, handler_class, pure_write, streaming, "
                                         "stream_open, half_closed_remote, server_open)");
        return NULL;
    }
    if (llmsim_slot_offsets(args[0], stream_fields, stream_offsets, 10) < 0
        || llmsim_slot_offsets(args[1], handler_fields, handler_offsets, 4) < 0) {
        return NULL;
    }
    PyObject **given[] = {&twin.handler_class, &twin.pure_write, &twin.streaming, &twin.stream_open,
                          &twin.half_closed_remote, &twin.server_open};
    for (size_t i = 0; i < 6; i++) {
        Py_XSETREF(*given[i], Py_NewRef(args[i + 1]));
    }
    Py_XSETREF(twin.stream_class, (PyTypeObject *)Py_NewRef(args[0]));
    if (llmsim_install_method(args[0], &write_def) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* install_h2_objects(stream_class, stream_machine_class, connection_class,
 * connection_machine_class): called once by h2_fastpath.py. */
static PyObject *
install_h2_objects(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2])
        || !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "install_h2_objects(stream_class, stream_machine_class, connection_class, "
                                         "connection_machine_class)");
        return NULL;
    }
    static const char *const stream_fields[] = {"state_machine", "stream_id", "outbound_flow_control_window"};
    Py_ssize_t *const stream_offsets[] = {&h2.stream_machine, &h2.stream_id, &h2.stream_window};
    static const char *const connection_fields[] = {"state_machine", "outbound_flow_control_window",
                                                    "max_outbound_frame_size"};
    Py_ssize_t *const connection_offsets[] = {&h2.connection_machine, &h2.connection_window, &h2.max_frame};
    static const char *const state_field[] = {"state"};
    Py_ssize_t *const stream_state_offset[] = {&h2.stream_state};
    Py_ssize_t *const connection_state_offset[] = {&h2.connection_state};
    if (llmsim_slot_offsets(args[0], stream_fields, stream_offsets, 3) < 0
        || llmsim_slot_offsets(args[1], state_field, stream_state_offset, 1) < 0
        || llmsim_slot_offsets(args[2], connection_fields, connection_offsets, 3) < 0
        || llmsim_slot_offsets(args[3], state_field, connection_state_offset, 1) < 0) {
        return NULL;
    }
    PyTypeObject **given[] = {&h2.stream_class, &h2.stream_machine_class, &h2.connection_class,
                              &h2.connection_machine_class};
    for (size_t i = 0; i < 4; i++) {
        Py_XSETREF(*given[i], (PyTypeObject *)Py_NewRef(args[i]));
    }
    Py_RETURN_NONE;
}

static PyMethodDef h2_functions[] = {
    {"install_http2_write", (PyCFunction)(void (*)(void))install_http2_write, METH_FASTCALL,
     "Install the compiled Http2Stream.write (see native/h2_write.c)."},
    {"install_h2_objects", (PyCFunction)(void (*)(void))install_h2_objects, METH_FASTCALL,
     "Give the compiled Http2Stream.write h2's slotted classes (see llmsim/protocol/native/h2_objects.py)."},
    {NULL, NULL, 0, NULL},
};

int
llmsim_h2_init(PyObject *module)
{
    static const llmsim_name names[] = {{&s_t, "_t"}, {&s_congested, "congested"}, {&s_wake_writer, "wake_writer"}};
    if (llmsim_intern_names(names, LLMSIM_COUNT(names)) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, h2_functions);
}
