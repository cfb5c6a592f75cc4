/* The C twin of StreamingSink.on_output (llmsim/api/generation.py): the sink every
 * streaming response's jobs report their tokens to, once per job and engine step.
 *
 * Taken in C: the token case, tokens in the middle of a choice (start > 0,
 * stop > start, job.state is JobState.DECODING) on a renderer with sse.PlainTokens.
 * One token's event opens[job.index] + escape(piece) + close is built in one
 * allocation; several tokens' (a late step hands out every token due) are
 * opens + (close + opens).join(escape_all(pieces)) + close, as _token_events makes
 * them.  The data is written with self._response.write(data) (any ResponseStream,
 * Python or C); on False, self._pause(job) (Python) and False.  Fields are read by slot offset: StreamingSink
 * has __slots__ and Job is attrs-slotted.  The escaped piece comes from sse's cache, the
 * dict behind sse.escaped_piece; on a miss sse.escape(text) is called (it fills the
 * cache), as the Python twin does.
 *
 * Handed to Python: every other call (the first or last token of a choice, more than
 * MAX_RUN tokens, an ended sink, an unexpected type, an unset field, keyword arguments) goes to
 * the pure twin, generation.PURE_ON_OUTPUT, before anything observable happened.  An
 * Exception raised once the event is being built (escape, write, its truth value,
 * _pause) is handled as the twin's `except Exception as error:` handles it:
 * self._rendering_failed(job, error) logs it and fails the stream, then True.
 * Any other BaseException (KeyboardInterrupt, trio.Cancelled) propagates.
 */
#include "speedups.h"

/* What install_streaming_sink was given (strong references, kept for the process). */
static PyTypeObject *sink_type;
static PyTypeObject *job_type;
static PyObject *decoding;       /* JobState.DECODING */
static PyObject *escaped_cache;  /* sse._escaped: str -> bytes */
static PyObject *escape_func;    /* sse.escape */
static PyObject *pure_on_output; /* generation.PURE_ON_OUTPUT */

static Py_ssize_t ended_offset, opens_offset, close_offset, response_offset; /* StreamingSink */
static Py_ssize_t state_offset, output_offset, index_offset, sink_offset;    /* Job */

static PyObject *write_name, *pause_name, *rendering_failed_name, *join_name; /* interned */

#define METHOD_ARGS(n) ((n) | PY_VECTORCALL_ARGUMENTS_OFFSET)

/* An exact int that fits a Py_ssize_t, or -1 (also for a negative one). */
static Py_ssize_t
small_index(PyObject *obj)
{
    if (!PyLong_CheckExact(obj)) {
        return -1;
    }
    Py_ssize_t value = PyLong_AsSsize_t(obj);
    if (value == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* too big: the pure twin decides */
    }
    return value < 0 ? -1 : value;
}

/* items[index] of an exact list or tuple, borrowed; NULL when not one or out of range. */
static PyObject *
sequence_item(PyObject *items, Py_ssize_t index)
{
    if (index < 0) {
        return NULL;
    }
    if (PyTuple_CheckExact(items)) {
        return index < PyTuple_GET_SIZE(items) ? PyTuple_GET_ITEM(items, index) : NULL;
    }
    if (PyList_CheckExact(items)) {
        return index < PyList_GET_SIZE(items) ? PyList_GET_ITEM(items, index) : NULL;
    }
    return NULL;
}

/* The most tokens one call takes in C (more: the pure twin). */
#define MAX_RUN 64

/* The parts of the event(s) of middle tokens (borrowed references). */
typedef struct {
    PyObject *open;     /* self._token_opens[job.index] */
    PyObject *text;     /* job.output[start] */
    PyObject *close;    /* self._token_close */
    PyObject *response; /* self._response */
    PyObject *output;   /* job.output (an exact list or tuple) */
    Py_ssize_t start, count; /* the tokens output[start:start + count] */
} token_parts;

/* Whether output[start:start + count] are all exact str (and within output). */
static int
all_text(PyObject *output, Py_ssize_t start, Py_ssize_t count)
{
    for (Py_ssize_t i = start; i < start + count; i++) {
        PyObject *piece = sequence_item(output, i);
        if (piece == NULL || !PyUnicode_CheckExact(piece)) {
            return 0;
        }
    }
    return 1;
}

/* generation.py StreamingSink.on_output: `if opens is not None and start and
 * stop > start and job.state is _DECODING:`, and every field the branch reads, of
 * the types the C path takes.  1 with ``parts`` filled, or 0: the pure twin's call.
 * Nothing here can raise or run Python code. */
static int
token_case(PyObject *self, PyObject *job, PyObject *start, PyObject *stop, token_parts *parts)
{
    PyObject *opens = LLMSIM_SLOT(self, opens_offset);
    if (opens == NULL || opens == Py_None || !Py_IS_TYPE(job, job_type)) {
        return 0;
    }
    Py_ssize_t first = small_index(start), last = small_index(stop);
    if (first <= 0 || last <= first || last - first > MAX_RUN) {
        return 0;
    }
    PyObject *state = LLMSIM_SLOT(job, state_offset);
    PyObject *output = LLMSIM_SLOT(job, output_offset);
    PyObject *index = LLMSIM_SLOT(job, index_offset);
    if (state != decoding || output == NULL || index == NULL) {
        return 0;
    }
    parts->output = output;
    parts->start = first;
    parts->count = last - first;
    parts->text = sequence_item(output, first);
    parts->open = sequence_item(opens, small_index(index));
    parts->close = LLMSIM_SLOT(self, close_offset);
    parts->response = LLMSIM_SLOT(self, response_offset);
    return all_text(output, first, parts->count) && parts->open != NULL &&
           PyBytes_CheckExact(parts->open) && parts->close != NULL && PyBytes_CheckExact(parts->close) &&
           parts->response != NULL;
}

/* open + escaped + close, three bytes objects, in one allocation. */
static PyObject *
concat3(PyObject *open, PyObject *escaped, PyObject *close)
{
    Py_ssize_t n1 = PyBytes_GET_SIZE(open), n2 = PyBytes_GET_SIZE(escaped), n3 = PyBytes_GET_SIZE(close);
    PyObject *data = PyBytes_FromStringAndSize(NULL, n1 + n2 + n3);
    if (data == NULL) {
        return NULL;
    }
    char *out = PyBytes_AS_STRING(data);
    memcpy(out, PyBytes_AS_STRING(open), (size_t)n1);
    memcpy(out + n1, PyBytes_AS_STRING(escaped), (size_t)n2);
    memcpy(out + n1 + n2, PyBytes_AS_STRING(close), (size_t)n3);
    return data;
}

/* open + escaped + close with Python's `+`: an escape that is not exact bytes. */
static PyObject *
concat3_generic(PyObject *open, PyObject *escaped, PyObject *close)
{
    PyObject *head = PyNumber_Add(open, escaped);
    if (head == NULL) {
        return NULL;
    }
    PyObject *data = PyNumber_Add(head, close);
    Py_DECREF(head);
    return data;
}

/* generation.py StreamingSink.on_output: `escaped = escaped_piece(text)` and
 * `data = opens[job.index] + (escaped if escaped is not None else escape(text)) +
 * self._token_close`.  A new reference, or NULL with an exception. */
static PyObject *
token_event(token_parts *parts)
{
    PyObject *escaped = PyDict_GetItemWithError(escaped_cache, parts->text);
    if (escaped != NULL && escaped != Py_None) {
        Py_INCREF(escaped);
    }
    else if (PyErr_Occurred()) {
        return NULL;
    }
    else {
        /* a miss; sse.escape touches neither the sink nor the job: the parts stay valid */
        escaped = PyObject_CallOneArg(escape_func, parts->text);
        if (escaped == NULL) {
            return NULL;
        }
    }
    PyObject *data = PyBytes_CheckExact(escaped) ? concat3(parts->open, escaped, parts->close)
                                                 : concat3_generic(parts->open, escaped, parts->close);
    Py_DECREF(escaped);
    return data;
}

/* sse.escape_all's `cached(piece) or escape(piece)` for one piece: a new reference, or
 * NULL with an exception. */
static PyObject *
escaped_or_escape(PyObject *piece)
{
    PyObject *cached = PyDict_GetItemWithError(escaped_cache, piece);
    if (cached == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (cached != NULL) {
        int truth = PyBytes_CheckExact(cached) ? PyBytes_GET_SIZE(cached) > 0 : PyObject_IsTrue(cached);
        if (truth < 0) {
            return NULL;
        }
        if (truth) {
            return Py_NewRef(cached);
        }
    }
    return PyObject_CallOneArg(escape_func, piece);
}

/* generation.py StreamingSink._token_events: opens + (close + opens).join(
 * escape_all(output[start:stop])) + close.  A new reference, or NULL with an exception.
 * (escape touches neither the sink nor the job: the parts stay valid.) */
static PyObject *
tokens_event(token_parts *parts)
{
    PyObject *pieces = PyList_New(parts->count);
    if (pieces == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < parts->count; i++) {
        PyObject *escaped = escaped_or_escape(sequence_item(parts->output, parts->start + i));
        if (escaped == NULL) {
            Py_DECREF(pieces);
            return NULL;
        }
        PyList_SET_ITEM(pieces, i, escaped);
    }
    PyObject *joiner = PyNumber_Add(parts->close, parts->open);
    PyObject *joined = joiner == NULL ? NULL : PyObject_CallMethodOneArg(joiner, join_name, pieces);
    Py_XDECREF(joiner);
    Py_DECREF(pieces);
    if (joined == NULL) {
        return NULL;
    }
    PyObject *data = concat3(parts->open, joined, parts->close); /* (bytes.join makes exact bytes) */
    Py_DECREF(joined);
    return data;
}

/* generation.py StreamingSink.on_output's `except Exception:` for an exception raised
 * in the C path: self._rendering_failed(job, error) logs it and fails the stream, then
 * True.  An exception raised by that call gets the first as its context, as raising
 * inside an `except` block does.  Any other BaseException propagates (NULL). */
static PyObject *
rendering_failed(PyObject *self, PyObject *job)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return NULL;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL) {
        PyException_SetTraceback(value, traceback); /* the log shows where it was raised */
    }
    PyObject *args[3] = {self, job, value};
    PyObject *result = PyObject_VectorcallMethod(rendering_failed_name, args, METHOD_ARGS(3), NULL);
    if (result == NULL) {
        PyObject *raised_type, *raised, *raised_traceback;
        PyErr_Fetch(&raised_type, &raised, &raised_traceback);
        PyErr_NormalizeException(&raised_type, &raised, &raised_traceback);
        if (raised != value) {
            PyException_SetContext(raised, Py_NewRef(value)); /* steals the new reference */
        }
        PyErr_Restore(raised_type, raised, raised_traceback);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    if (result == NULL) {
        return NULL;
    }
    Py_DECREF(result);
    Py_RETURN_TRUE;
}

/* generation.py StreamingSink.on_output's token case after the event is built:
 * `if self._response.write(data): return True`, else `self._pause(job); return False`. */
static PyObject *
write_token(PyObject *self, PyObject *job, PyObject *response, PyObject *data)
{
    Py_INCREF(response); /* a C write relies on its caller to hold it */
    PyObject *write_args[2] = {response, data};
    PyObject *written = PyObject_VectorcallMethod(write_name, write_args, METHOD_ARGS(2), NULL);
    Py_DECREF(response);
    if (written == NULL) {
        return rendering_failed(self, job);
    }
    int accepted = written == Py_True ? 1 : written == Py_False ? 0 : PyObject_IsTrue(written);
    Py_DECREF(written);
    if (accepted < 0) {
        return rendering_failed(self, job);
    }
    if (accepted) {
        Py_RETURN_TRUE;
    }
    PyObject *pause_args[2] = {self, job};
    PyObject *paused = PyObject_VectorcallMethod(pause_name, pause_args, METHOD_ARGS(2), NULL);
    if (paused == NULL) {
        return rendering_failed(self, job);
    }
    Py_DECREF(paused);
    Py_RETURN_FALSE;
}

/* speedups.h: the links of a token case's objects, ``ahead`` places before ``job``
 * (a Job of the engine's; its fields are read without a check of their own type only to
 * be prefetched), whose output starts at ``emitted`` (its ``emitted`` field). */
void
llmsim_prefetch_output(PyObject *job, PyObject *emitted, int ahead)
{
    if (sink_type == NULL || !Py_IS_TYPE(job, job_type)) {
        return; /* (the sink's twin is not installed: its offsets are not known) */
    }
    PyObject *sink = LLMSIM_SLOT(job, sink_offset);
    PyObject *output = LLMSIM_SLOT(job, output_offset);
    if (sink == NULL || output == NULL) {
        return;
    }
    if (ahead >= 3) {
        llmsim_prefetch(sink, sink_type->tp_basicsize);
        llmsim_prefetch(output, sizeof(PyListObject));
        return;
    }
    if (!Py_IS_TYPE(sink, sink_type)) {
        return;
    }
    PyObject *response = LLMSIM_SLOT(sink, response_offset);
    PyObject *opens = LLMSIM_SLOT(sink, opens_offset);
    PyObject *close = LLMSIM_SLOT(sink, close_offset);
    if (response == NULL || opens == NULL || close == NULL) {
        return;
    }
    llmsim_prefetch_h1_write(response, ahead);
    llmsim_prefetch_h2_write(response, ahead);
    Py_ssize_t start = emitted == NULL ? -1 : small_index(emitted);
    if (ahead == 2) {
        llmsim_prefetch(opens, sizeof(PyTupleObject));
        llmsim_prefetch(close, 64);
        if (PyList_CheckExact(output) && start >= 0 && start < PyList_GET_SIZE(output)) {
            llmsim_prefetch(&PyList_GET_ITEM(output, start), sizeof(PyObject *));
        }
        return;
    }
    PyObject *index = LLMSIM_SLOT(job, index_offset);
    PyObject *open = index == NULL ? NULL : sequence_item(opens, small_index(index));
    PyObject *text = sequence_item(output, start);
    if (open != NULL) {
        llmsim_prefetch(open, 64);
    }
    if (text != NULL) {
        llmsim_prefetch(text, 64);
    }
}

/* StreamingSink.on_output(self, job, start, stop, now) -> bool (generation.py). */
static PyObject *
sink_on_output(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs != 4 || kwnames != NULL || !Py_IS_TYPE(self, sink_type)) {
        return llmsim_call_with_self(pure_on_output, self, args, nargs, kwnames);
    }
    PyObject *ended = LLMSIM_SLOT(self, ended_offset);
    if (ended == Py_True) {
        Py_RETURN_TRUE; /* `if self._ended: return True` */
    }
    token_parts parts;
    if (ended != Py_False || !token_case(self, args[0], args[1], args[2], &parts)) {
        return llmsim_call_with_self(pure_on_output, self, args, nargs, kwnames);
    }
    PyObject *data = parts.count == 1 ? token_event(&parts) : tokens_event(&parts);
    if (data == NULL) {
        return rendering_failed(self, args[0]);
    }
    PyObject *result = write_token(self, args[0], parts.response, data);
    Py_DECREF(data);
    return result;
}

static PyMethodDef on_output_def = {
    "on_output",
    (PyCFunction)(void (*)(void))sink_on_output,
    METH_FASTCALL | METH_KEYWORDS,
    "StreamingSink.on_output, compiled (native/sink.c); generation.PURE_ON_OUTPUT is the reference.",
};

/* A strong reference to ``obj`` in ``*field`` (replacing an earlier install's). */
static void
keep(PyObject **field, PyObject *obj)
{
    Py_INCREF(obj);
    Py_XSETREF(*field, obj);
}

/* The slot offsets the C path reads; 0, or -1 with an exception (then none is changed). */
static int
find_offsets(PyObject *sink_cls, PyObject *job_cls)
{
    static const char *const sink_fields[] = {"_ended", "_token_opens", "_token_close", "_response"};
    static const char *const job_fields[] = {"state", "output", "index", "sink"};
    Py_ssize_t *const sink_offsets[] = {&ended_offset, &opens_offset, &close_offset, &response_offset};
    Py_ssize_t *const job_offsets[] = {&state_offset, &output_offset, &index_offset, &sink_offset};
    Py_ssize_t saved[4] = {ended_offset, opens_offset, close_offset, response_offset};
    if (llmsim_slot_offsets(sink_cls, sink_fields, sink_offsets, 4) < 0) {
        return -1;
    }
    if (llmsim_slot_offsets(job_cls, job_fields, job_offsets, 4) < 0) {
        ended_offset = saved[0], opens_offset = saved[1], close_offset = saved[2], response_offset = saved[3];
        return -1;
    }
    return 0;
}

/* install_streaming_sink(StreamingSink, Job, JobState.DECODING, sse._escaped, sse.escape,
 * PURE_ON_OUTPUT): make StreamingSink.on_output the C twin. */
static PyObject *
install_streaming_sink(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "install_streaming_sink() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *sink_cls = args[0], *job_cls = args[1];
    if (!PyDict_CheckExact(args[3]) || !PyCallable_Check(args[4]) || !PyCallable_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "install_streaming_sink(): expected a dict and two callables");
        return NULL;
    }
    if (find_offsets(sink_cls, job_cls) < 0) {
        return NULL;
    }
    keep((PyObject **)&sink_type, sink_cls);
    keep((PyObject **)&job_type, job_cls);
    keep(&decoding, args[2]);
    keep(&escaped_cache, args[3]);
    keep(&escape_func, args[4]);
    keep(&pure_on_output, args[5]);
    if (llmsim_install_method(sink_cls, &on_output_def) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef sink_functions[] = {
    {"install_streaming_sink", (PyCFunction)(void (*)(void))install_streaming_sink, METH_FASTCALL,
     "install_streaming_sink(sink_cls, job_cls, decoding, escaped_cache, escape, pure_on_output)\n\n"
     "Make sink_cls.on_output the C twin of StreamingSink.on_output (native/sink.c)."},
    {NULL, NULL, 0, NULL},
};

int
llmsim_sink_init(PyObject *module)
{
    static const llmsim_name names[] = {
        {&write_name, "write"},
        {&pause_name, "_pause"},
        {&rendering_failed_name, "_rendering_failed"},
        {&join_name, "join"},
    };
    if (llmsim_intern_names(names, LLMSIM_COUNT(names)) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, sink_functions);
}
