/* llmsim._speedups: the module, and the helpers shared by its parts (speedups.h). */
#include "speedups.h"

Py_ssize_t
llmsim_slot_offset(PyObject *cls, const char *name)
{
    if (!PyType_Check(cls)) {
        PyErr_Format(PyExc_TypeError, "expected a class, got %R", cls);
        return -1;
    }
    /* the class attribute of a slot is its member descriptor (along the MRO) */
    PyObject *descr = PyObject_GetAttrString(cls, name);
    if (descr == NULL) {
        return -1;
    }
    int is_member = Py_IS_TYPE(descr, &PyMemberDescr_Type);
    PyMemberDef *member = is_member ? ((PyMemberDescrObject *)descr)->d_member : NULL;
    Py_DECREF(descr); /* the class holds it */
    if (member == NULL || member->type != T_OBJECT_EX || (member->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not a writable object slot", cls, name);
        return -1;
    }
    return member->offset;
}

int
llmsim_intern_names(const llmsim_name *names, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (*names[i].name == NULL && (*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return -1;
        }
    }
    return 0;
}

int
llmsim_slot_offsets(PyObject *cls, const char *const *names, Py_ssize_t *const *offsets, size_t count)
{
    Py_ssize_t found[LLMSIM_MAX_SLOTS];
    if (count > LLMSIM_MAX_SLOTS) {
        PyErr_SetString(PyExc_SystemError, "llmsim_slot_offsets: too many slots");
        return -1;
    }
    for (size_t i = 0; i < count; i++) {
        found[i] = llmsim_slot_offset(cls, names[i]);
        if (found[i] < 0) {
            return -1;
        }
    }
    for (size_t i = 0; i < count; i++) {
        *offsets[i] = found[i];
    }
    return 0;
}

int
llmsim_install_method(PyObject *cls, PyMethodDef *def)
{
    PyObject *descr = PyDescr_NewMethod((PyTypeObject *)cls, def);
    if (descr == NULL) {
        return -1;
    }
    int result = PyObject_SetAttrString(cls, def->ml_name, descr);
    Py_DECREF(descr);
    return result;
}

PyObject *
llmsim_call_with_self(PyObject *function, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames)
{
    Py_ssize_t total = nargs + (kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames));
    PyObject *small[8];
    /* one slot before the arguments, as PY_VECTORCALL_ARGUMENTS_OFFSET allows the callee to use */
    PyObject **all = total + 2 <= 8 ? small : PyMem_Malloc((size_t)(total + 2) * sizeof(PyObject *));
    if (all == NULL) {
        return PyErr_NoMemory();
    }
    all[1] = self;
    memcpy(all + 2, args, (size_t)total * sizeof(PyObject *));
    PyObject *result =
        PyObject_Vectorcall(function, all + 1, (size_t)(nargs + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
    if (all != small) {
        PyMem_Free(all);
    }
    return result;
}

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "llmsim._speedups",
    .m_doc = "The compiled twins of llmsim's per-token path (see llmsim/speedups.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *module = PyModule_Create(&speedups_module);
    if (module == NULL) {
        return NULL;
    }
    if (llmsim_engine_init(module) < 0 || llmsim_sink_init(module) < 0 || llmsim_h2_init(module) < 0
        || llmsim_h1_init(module) < 0 || llmsim_wake_init(module) < 0 || llmsim_flush_init(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
