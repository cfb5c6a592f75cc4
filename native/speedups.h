/* The compiled per-token path of llmsim (module llmsim._speedups): shared helpers.
 *
 * Each part (engine_run.c with engine_advance.c, sink.c, h2_write.c, h1_write.c, wake.c, flush.c) is the twin
 * of a pure-Python function that stays the reference: llmsim/speedups.py says which are installed, and
 * LLMSIM_PURE=1 turns them all off.  The C code reads the fields of llmsim's own
 * slotted (attrs) classes by their slot offsets, given at install time as the
 * classes' member descriptors, so a field costs one load instead of a generic
 * attribute lookup: that is where the gain over the interpreter comes from
 * (docs/performance.md, "The compiled per-token path").
 */
#ifndef LLMSIM_SPEEDUPS_H
#define LLMSIM_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* The field at ``offset`` of a slotted instance (a borrowed reference; NULL when unset). */
#define LLMSIM_SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* Replace the field at ``offset`` by ``value`` (a new reference is taken). */
static inline void
llmsim_slot_set(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    PyObject **field = (PyObject **)((char *)obj + offset);
    PyObject *old = *field;
    Py_INCREF(value);
    *field = value;
    Py_XDECREF(old);
}

/* The slot offset of ``cls.name``, which must be a slot (a T_OBJECT_EX member
 * descriptor) of ``cls``'s instances; -1 with an exception set otherwise. */
Py_ssize_t llmsim_slot_offset(PyObject *cls, const char *name);

/* The slot offsets of ``names`` (``count`` of them, at most LLMSIM_MAX_SLOTS) in ``cls``,
 * stored through ``offsets``: 0, or -1 with an exception and none of them changed. */
#define LLMSIM_MAX_SLOTS 16
int llmsim_slot_offsets(PyObject *cls, const char *const *names, Py_ssize_t *const *offsets, size_t count);

/* An attribute name a part calls or reads by, interned once at module init. */
typedef struct {
    PyObject **name; /* where the interned string goes */
    const char *text;
} llmsim_name;

/* Intern ``count`` names (each one still unset); 0, or -1 with an exception. */
int llmsim_intern_names(const llmsim_name *names, size_t count);

/* --- Prefetching ------------------------------------------------------------------
 * A paced engine step visits every stream's objects once per inter-token latency: on a
 * busy machine they have left the caches by then, and the per-token C code waited on one
 * miss after the other, each object reached through the one before it (a job, its sink,
 * the sink's response, the response's handler...).  The loops over a step's jobs
 * (engine_run.c) and over the connections to flush (flush.c) therefore ask for the
 * objects of the entries a few places ahead, one link of the chain further per place
 * nearer, so that each miss overlaps the work on the current entry.  A hint reads only
 * the fields of objects whose exact type it has checked (a prefetch itself never faults),
 * calls no Python code, changes nothing and cannot fail: it has no effect but on time
 * (docs/performance.md, "Issue 16, tenth pass"). */

/* Ask for the cache lines of ``size`` bytes from ``address``. */
static inline void
llmsim_prefetch(const void *address, Py_ssize_t size)
{
    for (Py_ssize_t at = 0; at < size; at += 64) {
        __builtin_prefetch((const char *)address + at, 1, 3);
    }
}

/* Read the cache lines of ``size`` bytes from ``address`` (a load each, kept by the
 * compiler: unlike a prefetch, it is never dropped). */
static inline void
llmsim_touch(const void *address, Py_ssize_t size)
{
    for (Py_ssize_t at = 0; at < size; at += 64) {
        __asm__ volatile("" : : "r"(*(const volatile char *)((const char *)address + at)));
    }
}

/* The hint for a write to ``response`` ``ahead`` places on, where ``cls`` (NULL: not
 * installed) is the protocol's response class: 2 or more, the response; 1, the object in
 * its slot at ``link_offset`` if that is exactly a ``link_cls`` (the response's exact type
 * checked first).  h1_write.c's and h2_write.c's hints. */
static inline void
llmsim_prefetch_link(PyObject *response, int ahead, PyTypeObject *cls, Py_ssize_t link_offset, PyTypeObject *link_cls)
{
    if (cls == NULL) {
        return;
    }
    if (ahead >= 2) {
        llmsim_prefetch(response, cls->tp_basicsize);
        return;
    }
    PyObject *link = Py_IS_TYPE(response, cls) ? LLMSIM_SLOT(response, link_offset) : NULL;
    if (link != NULL && link_cls != NULL && Py_IS_TYPE(link, link_cls)) {
        llmsim_prefetch(link, link_cls->tp_basicsize);
    }
}

/* How many places ahead the loops start a chain: its links are taken one per place. */
#define LLMSIM_PREFETCH_AHEAD 4

/* sink.c: for ``job``'s next output (tokens from ``emitted``, the job's field, an int or
 * anything else: then no hint for its text) through its StreamingSink,
 * the link ``ahead`` places before the job is reached (3: the sink and the output list;
 * 2: the response, the event's parts, the output's entry; 1: the response's own next
 * link, the event's opening and the token's text). */
void llmsim_prefetch_output(PyObject *job, PyObject *emitted, int ahead);

/* h1_write.c and h2_write.c: for a write to ``response`` ``ahead`` places on, if it is
 * their protocol's (2: the response; 1: the handler of an HTTP/1.1 response, h2's
 * stream of an HTTP/2 one). */
void llmsim_prefetch_h1_write(PyObject *response, int ahead);
void llmsim_prefetch_h2_write(PyObject *response, int ahead);

#define LLMSIM_COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* Make ``def`` a method of the class ``cls`` (a method descriptor, as a method of a
 * C type is: called without a bound-method object); 0, or -1 with an exception. */
int llmsim_install_method(PyObject *cls, PyMethodDef *def);

/* ``function(self, *args, **kwargs)`` for a vectorcall's arguments: how a twin hands a
 * call it does not take to its pure-Python function. */
PyObject *llmsim_call_with_self(PyObject *function, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames);

/* --- the engine loop: engine_run.c (Engine._run) and engine_advance.c (Engine._advance,
 * Timetable._enter) share one call's state and the job-field readers --------------------- */

/* Where one _run call puts each job next (scheduler.py:Engine._run's locals). */
typedef struct {
    PyObject *engine, *now, *reach; /* borrowed: _run's self, ``now`` and ``reach`` (exact floats) */
    double now_value, reach_value;
    int has_fixed_itl;
    double fixed_itl;
    PyObject *latency;             /* engine._latency as the call began (strong) */
    int advance_in_c, enter_in_c;  /* the engine's _advance / _enter are the classes' own: -1 not known yet */
    Py_ssize_t generated;          /* tokens handed out (engine._generated_tokens, in the finally block) */
    double first, last;            /* deadlines in [first, last] go to ``slot``, whose entries are ``bucket`` */
    PyObject *slot, *bucket;       /* strong */
} llmsim_advance;

/* A job's field (borrowed), or NULL with the AttributeError reading it raises. */
static inline PyObject *
llmsim_job_field(PyObject *job, Py_ssize_t offset, const char *name)
{
    PyObject *value = LLMSIM_SLOT(job, offset);
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "'%.200s' object has no attribute '%s'", Py_TYPE(job)->tp_name, name);
    }
    return value;
}

/* The value of a job's time field as a float operation with a float sees it (an exact
 * float, or an exact int converted as float arithmetic converts it); -1 with an
 * exception otherwise.  _run's pre-scan lets only these types in, so a TypeError here
 * means a sink wrote something else into a job mid-step. */
static inline int
llmsim_job_time(PyObject *job, Py_ssize_t offset, const char *name, double *out)
{
    PyObject *value = llmsim_job_field(job, offset, name);
    if (value == NULL) {
        return -1;
    }
    if (PyFloat_CheckExact(value)) {
        *out = PyFloat_AS_DOUBLE(value);
        return 0;
    }
    if (PyLong_CheckExact(value)) {
        *out = PyLong_AsDouble(value);
        return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
    }
    PyErr_Format(PyExc_TypeError, "engine _run (C): job.%s is a %.200s, not a float", name, Py_TYPE(value)->tp_name);
    return -1;
}

/* engine_advance.c: a job's tokens due by ``reach`` from ``start`` and its next entry
 * (Engine._advance, with _run's inlined one-token case): 1 with ``*stop`` (a new
 * reference), 0 when the Python _advance should take it (nothing done), -1 with an exception. */
int llmsim_advance_job(llmsim_advance *adv, PyObject *job, Py_ssize_t start, PyObject **stop);
void llmsim_advance_clear(llmsim_advance *adv);
int llmsim_engine_advance_init(PyObject *module);

/* Each part adds its functions to the module; 0, or -1 with an exception. */
int llmsim_engine_init(PyObject *module);
int llmsim_sink_init(PyObject *module);
int llmsim_h2_init(PyObject *module);
int llmsim_h1_init(PyObject *module);
int llmsim_wake_init(PyObject *module);
int llmsim_flush_init(PyObject *module);

#endif
