/* The C twin of Connection.wake_writer (llmsim/protocol/native/connection.py).
 *
 * On HTTP/1.1 every paced token wakes its connection's writer (Http1Response.write),
 * on HTTP/2 the first frame of a connection's batch does; while the engine steps the
 * write coalescer holds those wake-ups: the connection only goes into its queue, once.
 * Taken in C: that case (the connection already dirty: nothing; else, with a held
 * coalescer and a direct socket: dirty, and ``coalescer.defer(self)``).  Fields are read
 * by slot offset (Connection and WriteCoalescer are attrs-slotted).  Handed to the pure
 * twin, connection.PURE_WAKE_WRITER, before anything changed: everything else (the
 * writer task unparked, values of unexpected types, a subclass).
 */
#include "speedups.h"

static PyTypeObject *connection_type, *coalescer_type;
static PyObject *pure_wake_writer;
static Py_ssize_t dirty_offset, coalescer_offset, direct_offset; /* Connection */
static Py_ssize_t held_offset, defer_offset;                     /* WriteCoalescer */

/* Connection.wake_writer(self) */
static PyObject *
wake_writer(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs == 0 && kwnames == NULL && Py_IS_TYPE(self, connection_type)) {
        PyObject *dirty = LLMSIM_SLOT(self, dirty_offset);
        if (dirty == Py_True) {
            Py_RETURN_NONE; /* `if not self._dirty:` */
        }
        PyObject *coalescer = LLMSIM_SLOT(self, coalescer_offset);
        PyObject *direct = LLMSIM_SLOT(self, direct_offset);
        if (dirty == Py_False && coalescer != NULL && Py_IS_TYPE(coalescer, coalescer_type) && direct != NULL &&
            direct != Py_None && LLMSIM_SLOT(coalescer, held_offset) == Py_True) {
            PyObject *defer = LLMSIM_SLOT(coalescer, defer_offset);
            if (defer != NULL) {
                llmsim_slot_set(self, dirty_offset, Py_True);
                Py_INCREF(defer);
                PyObject *result = PyObject_CallOneArg(defer, self);
                Py_DECREF(defer);
                if (result == NULL) {
                    return NULL;
                }
                Py_DECREF(result);
                Py_RETURN_NONE;
            }
        }
    }
    /* the pure twin: it wakes the writer task, or says what is wrong with the call */
    return llmsim_call_with_self(pure_wake_writer, self, args, nargs, kwnames);
}

static PyMethodDef wake_writer_def = {
    "wake_writer",
    (PyCFunction)(void (*)(void))wake_writer,
    METH_FASTCALL | METH_KEYWORDS,
    "Connection.wake_writer in C (native/wake.c); the pure twin is connection.PURE_WAKE_WRITER.",
};

/* install_wake_writer(Connection, WriteCoalescer, pure_wake_writer) */
static PyObject *
install_wake_writer(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyType_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "install_wake_writer(Connection, WriteCoalescer, pure_wake_writer)");
        return NULL;
    }
    static const char *const connection_fields[] = {"_dirty", "coalescer", "_direct"};
    Py_ssize_t *const connection_offsets[] = {&dirty_offset, &coalescer_offset, &direct_offset};
    static const char *const coalescer_fields[] = {"held", "defer"};
    Py_ssize_t *const coalescer_offsets[] = {&held_offset, &defer_offset};
    if (llmsim_slot_offsets(args[0], connection_fields, connection_offsets, 3) < 0 ||
        llmsim_slot_offsets(args[1], coalescer_fields, coalescer_offsets, 2) < 0) {
        return NULL;
    }
    Py_XSETREF(connection_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(coalescer_type, (PyTypeObject *)Py_NewRef(args[1]));
    Py_XSETREF(pure_wake_writer, Py_NewRef(args[2]));
    if (llmsim_install_method(args[0], &wake_writer_def) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef functions[] = {
    {"install_wake_writer", (PyCFunction)(void (*)(void))install_wake_writer, METH_FASTCALL,
     "install_wake_writer(Connection, WriteCoalescer, pure): make Connection.wake_writer the C twin."},
    {NULL, NULL, 0, NULL},
};

int
llmsim_wake_init(PyObject *module)
{
    return PyModule_AddFunctions(module, functions);
}
