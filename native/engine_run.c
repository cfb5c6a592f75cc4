/* The C twin of Engine._run (llmsim/engine/scheduler.py): the engine's per-token loop.
 *
 * Installed as the method ``Engine._run`` by llmsim/engine/native_run.py; the pure
 * function stays the reference (llmsim.engine.scheduler.PURE_RUN).  Taken in C: the
 * loop over one bucket (or the ready list), the stale and paused checks, the ITL
 * histogram bucket cache and sum, the sink call and the pause rule, and the put-back /
 * bookkeeping of the try/except/finally.  Each job's tokens and next entry go to
 * engine_advance.c (_run's inlined one-token case, and Engine._advance's catch-ups with
 * a fixed ITL and last tokens, with the remembered grid span and Timetable._enter's
 * twin).  Handed to Python: everything else the Python twin delegates
 * (Engine._start_decoding, _advance without a fixed ITL, _put_back, sink.on_output),
 * and whole calls whose arguments or engine fields are not what the engine itself
 * makes (``now``/``reach`` not exact floats, a fixed ITL not a float, an entry not
 * exactly a Job or with fields of other types, ...): those run the pure function.  (A
 * field of another type met mid-loop, which only a sink writing into another job of the
 * same bucket could cause, raises TypeError.)
 *
 * Job fields are read and written by slot offset (Job is an attrs slotted class).
 * Floats: every job's last_token_time is the caller's ``now`` object; a float is made
 * only for a new deadline, as the Python twin does.
 */
#include "speedups.h"

/* --- given at install (install_engine_run) --------------------------------------- */
static PyObject *job_type;       /* llmsim.engine.job.Job */
static PyObject *pure_run;       /* the pure Engine._run */
static PyObject *state_prefill;  /* JobState.PREFILL */
static PyObject *state_decoding; /* JobState.DECODING */
static PyObject *ready_slot;     /* llmsim.engine.timetable.READY */
static Py_ssize_t off_slot, off_paused, off_emitted, off_state, off_last_token_time, off_deadline, off_sink;

/* --- interned names (llmsim_engine_init) ----------------------------------------- */
static PyObject *str_latency, *str_fixed_itl, *str_metrics, *str_inter_token_latency, *str_bounds, *str_counts,
    *str_sum, *str_ready, *str_resumed, *str_generated_tokens, *str_start_decoding, *str_advance, *str_put_back,
    *str_on_output;

/* The locals of one _run call (scheduler.py:Engine._run): the arguments borrowed, the
 * other objects strong references. */
typedef struct {
    llmsim_advance adv; /* engine, now, reach, the fixed ITL, the count of tokens, the entry cache */
    PyObject *jobs, *time;
    PyObject *histogram, *bounds, *counts, *resumed;
    Py_ssize_t bound_count;
    /* the ITL bucket (low, high] of counts[index], and the ITLs counted in it not yet added */
    double low, high;
    Py_ssize_t index, in_bucket;
    double itl_sum;
} RunState;

static void
run_state_clear(RunState *st)
{
    Py_CLEAR(st->histogram);
    Py_CLEAR(st->bounds);
    Py_CLEAR(st->counts);
    Py_CLEAR(st->resumed);
    llmsim_advance_clear(&st->adv);
}

/* --- small helpers ------------------------------------------------------------------ */

/* ``a != b`` (Python's operator: no identity shortcut); 1, 0, or -1 with an exception. */
static inline int
not_equal(PyObject *a, PyObject *b)
{
    if (PyFloat_CheckExact(a) && PyFloat_CheckExact(b)) {
        return PyFloat_AS_DOUBLE(a) != PyFloat_AS_DOUBLE(b);
    }
    if (a == Py_None) { /* None compares by identity */
        return b != Py_None;
    }
    Py_INCREF(a); /* held, as on Python's stack: the comparison may run Python code */
    Py_INCREF(b);
    PyObject *result = PyObject_RichCompare(a, b, Py_NE);
    Py_DECREF(a);
    Py_DECREF(b);
    if (result == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(result);
    Py_DECREF(result);
    return truth;
}

/* ``bool(value)`` with the common cases first. */
static inline int
truth(PyObject *value)
{
    if (value == Py_True) {
        return 1;
    }
    if (value == Py_False) {
        return 0;
    }
    Py_INCREF(value); /* held: __bool__ may run Python code */
    int result = PyObject_IsTrue(value);
    Py_DECREF(value);
    return result;
}

/* job.emitted as a C integer (an exact int, see llmsim_job_time). */
static inline int
emitted_value(PyObject *emitted, Py_ssize_t *out)
{
    if (!PyLong_CheckExact(emitted)) {
        PyErr_Format(PyExc_TypeError, "engine _run (C): an emitted count is a %.200s, not an int",
                     Py_TYPE(emitted)->tp_name);
        return -1;
    }
    *out = PyLong_AsSsize_t(emitted);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* engine.<name>(args...), the result discarded; 0, or -1 with an exception. */
static int
call_engine(PyObject *name, PyObject *const *args, size_t nargs)
{
    PyObject *result = PyObject_VectorcallMethod(name, (PyObject **)args, nargs | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_XDECREF(result);
    return result == NULL ? -1 : 0;
}

/* --- the ITL histogram (scheduler.py:Engine._run, ``if start:``) ------------------- */

/* ``itl_counts[index] += in_bucket``. */
static int
flush_bucket(RunState *st)
{
    if (st->index >= PyList_GET_SIZE(st->counts)) {
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return -1;
    }
    PyObject *count = PyList_GET_ITEM(st->counts, st->index);
    PyObject *added = PyLong_FromSsize_t(st->in_bucket);
    if (added == NULL) {
        return -1;
    }
    Py_INCREF(count);
    PyObject *total = PyNumber_InPlaceAdd(count, added);
    Py_DECREF(count);
    Py_DECREF(added);
    if (total == NULL) {
        return -1;
    }
    return PyList_SetItem(st->counts, st->index, total); /* steals total */
}

/* ``bisect_left(itl_bounds, itl)`` on the bounds (exact floats, checked per call). */
static inline Py_ssize_t
bisect_bounds(PyObject *bounds, Py_ssize_t count, double itl)
{
    Py_ssize_t low = 0, high = count;
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(bounds, middle)) < itl) {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    return low;
}

/* One inter-token latency: the cached bucket, or a new one found by bisection. */
static int
observe_itl(RunState *st, double itl)
{
    if (st->low < itl && itl <= st->high) {
        st->in_bucket += 1;
    } else {
        if (flush_bucket(st) < 0) {
            return -1;
        }
        Py_ssize_t index = bisect_bounds(st->bounds, st->bound_count, itl);
        st->index = index;
        st->low = index ? PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(st->bounds, index - 1)) : -Py_HUGE_VAL;
        st->high = index < st->bound_count ? PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(st->bounds, index)) : Py_HUGE_VAL;
        st->in_bucket = 1;
    }
    st->itl_sum += itl;
    return 0;
}

/* --- one job (the loop body of scheduler.py:Engine._run) ---------------------------- */

/* The tokens of a live job: the ITL, its first-token switch, the next entry;
 * returns ``stop`` (a new reference) or NULL with an exception. */
static PyObject *
hand_out(RunState *st, PyObject *job, PyObject *start, Py_ssize_t start_value)
{
    if (start_value) { /* one inter-token latency per output, however many tokens it carries */
        double last_token_time;
        if (llmsim_job_time(job, off_last_token_time, "last_token_time", &last_token_time) < 0 ||
            observe_itl(st, st->adv.now_value - last_token_time) < 0) {
            return NULL;
        }
    } else {
        PyObject *state = llmsim_job_field(job, off_state, "state");
        if (state == NULL) {
            return NULL;
        }
        PyObject *args[4] = {NULL, st->adv.engine, job, st->adv.now};
        if (state == state_prefill && call_engine(str_start_decoding, args + 1, 3) < 0) {
            return NULL;
        }
    }
    llmsim_slot_set(job, off_last_token_time, st->adv.now);
    PyObject *stop = NULL;
    int taken = llmsim_advance_job(&st->adv, job, start_value, &stop); /* the fixed-ITL cases, the last token */
    if (taken) {
        return stop;
    }
    /* the general case: ``stop = self._advance(job, start, now, reach)`` */
    PyObject *args[6] = {NULL, st->adv.engine, job, start, st->adv.now, st->adv.reach};
    stop = PyObject_VectorcallMethod(str_advance, args + 1, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_ssize_t stop_value;
    if (stop == NULL || emitted_value(stop, &stop_value) < 0) {
        Py_XDECREF(stop);
        return NULL;
    }
    st->adv.generated += stop_value - start_value;
    return stop;
}

/* The sink call and the pause rule: False pauses a decoding job, unless a resume()
 * of it during the call noted this very ``stop`` (Engine.resume). */
static int
call_sink(RunState *st, PyObject *job, PyObject *start, PyObject *stop)
{
    PyObject *sink = llmsim_job_field(job, off_sink, "sink");
    if (sink == NULL) {
        return -1;
    }
    Py_INCREF(sink);
    PyObject *args[6] = {NULL, sink, job, start, stop, st->adv.now};
    PyObject *accepted = PyObject_VectorcallMethod(str_on_output, args + 1, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(sink);
    if (accepted == NULL) {
        return -1;
    }
    int accept = truth(accepted);
    Py_DECREF(accepted);
    if (accept) {
        return accept < 0 ? -1 : 0;
    }
    PyObject *state = llmsim_job_field(job, off_state, "state");
    if (state == NULL) {
        return -1;
    }
    if (state != state_decoding) {
        return 0;
    }
    PyObject *noted = PyDict_GetItemWithError(st->resumed, job);
    if (noted == NULL && PyErr_Occurred()) {
        return -1;
    }
    Py_XINCREF(noted);
    int paused = not_equal(noted != NULL ? noted : Py_None, stop);
    Py_XDECREF(noted);
    if (paused < 0) {
        return -1;
    }
    llmsim_slot_set(job, off_paused, paused ? Py_True : Py_False);
    return 0;
}

static int
run_job(RunState *st, PyObject *job)
{
    PyObject *slot = llmsim_job_field(job, off_slot, "slot");
    int stale = slot == NULL ? -1 : not_equal(slot, st->time);
    if (stale) {
        return stale < 0 ? -1 : 0; /* stale: the job moved on */
    }
    PyObject *paused = llmsim_job_field(job, off_paused, "paused");
    int is_paused = paused == NULL ? -1 : truth(paused);
    if (is_paused) {
        if (is_paused > 0) {
            llmsim_slot_set(job, off_slot, Py_None); /* consumed: resume gives it a new entry */
        }
        return is_paused < 0 ? -1 : 0;
    }
    PyObject *start = llmsim_job_field(job, off_emitted, "emitted");
    Py_ssize_t start_value;
    if (start == NULL || emitted_value(start, &start_value) < 0) {
        return -1;
    }
    Py_INCREF(start);
    PyObject *stop = hand_out(st, job, start, start_value);
    int result = stop == NULL ? -1 : call_sink(st, job, start, stop);
    Py_XDECREF(stop);
    Py_DECREF(start);
    return result;
}

/* --- the call: locals, loop, except, finally ------------------------------------- */

/* Whether every entry is what the engine makes (else the pure twin takes the call). */
static int
plain_jobs(PyObject *jobs)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(jobs); i++) {
        PyObject *job = PyList_GET_ITEM(jobs, i);
        if (!Py_IS_TYPE(job, (PyTypeObject *)job_type)) {
            return 0;
        }
        PyObject *emitted = LLMSIM_SLOT(job, off_emitted);
        PyObject *last = LLMSIM_SLOT(job, off_last_token_time);
        PyObject *deadline = LLMSIM_SLOT(job, off_deadline);
        if (emitted == NULL || !PyLong_CheckExact(emitted) || last == NULL ||
            !(PyFloat_CheckExact(last) || PyLong_CheckExact(last)) || deadline == NULL ||
            !(PyFloat_CheckExact(deadline) || PyLong_CheckExact(deadline))) {
            return 0;
        }
    }
    return 1;
}

/* The locals of the Python twin (its lines before ``try``); 1, or 0 (with no
 * exception) when the call is one for the pure twin. */
static int
run_state_init(RunState *st, PyObject *const *args)
{
    llmsim_advance *adv = &st->adv;
    st->jobs = args[0];
    st->time = args[1];
    adv->now = args[2];
    adv->reach = args[4];
    if (!PyList_CheckExact(st->jobs) || !PyFloat_CheckExact(adv->now) || !PyFloat_CheckExact(adv->reach) ||
        !plain_jobs(st->jobs)) {
        return 0;
    }
    adv->now_value = PyFloat_AS_DOUBLE(adv->now);
    adv->reach_value = PyFloat_AS_DOUBLE(adv->reach);
    adv->latency = PyObject_GetAttr(adv->engine, str_latency);
    PyObject *fixed_itl = adv->latency == NULL ? NULL : PyObject_GetAttr(adv->latency, str_fixed_itl);
    if (fixed_itl == NULL || (fixed_itl != Py_None && !PyFloat_CheckExact(fixed_itl))) {
        Py_XDECREF(fixed_itl);
        return 0;
    }
    adv->has_fixed_itl = fixed_itl != Py_None;
    adv->fixed_itl = adv->has_fixed_itl ? PyFloat_AS_DOUBLE(fixed_itl) : 0.0;
    Py_DECREF(fixed_itl);
    adv->advance_in_c = adv->enter_in_c = -1;
    PyObject *metrics = PyObject_GetAttr(st->adv.engine, str_metrics);
    st->histogram = metrics == NULL ? NULL : PyObject_GetAttr(metrics, str_inter_token_latency);
    Py_XDECREF(metrics);
    st->bounds = st->histogram == NULL ? NULL : PyObject_GetAttr(st->histogram, str_bounds);
    st->counts = st->bounds == NULL ? NULL : PyObject_GetAttr(st->histogram, str_counts);
    adv->bucket = st->counts == NULL ? NULL : PyObject_GetAttr(adv->engine, str_ready);
    st->resumed = adv->bucket == NULL ? NULL : PyObject_GetAttr(st->adv.engine, str_resumed);
    if (st->resumed == NULL || !PyTuple_CheckExact(st->bounds) || !PyList_CheckExact(st->counts) ||
        !PyDict_CheckExact(st->resumed) || PyList_GET_SIZE(st->counts) != PyTuple_GET_SIZE(st->bounds) + 1) {
        return 0;
    }
    st->bound_count = PyTuple_GET_SIZE(st->bounds);
    for (Py_ssize_t i = 0; i < st->bound_count; i++) {
        if (!PyFloat_CheckExact(PyTuple_GET_ITEM(st->bounds, i))) {
            return 0;
        }
    }
    st->low = Py_HUGE_VAL;
    st->high = -Py_HUGE_VAL;
    adv->first = Py_HUGE_VAL;
    adv->last = -Py_HUGE_VAL;
    adv->slot = Py_NewRef(ready_slot);
    return 1;
}

/* The exception being raised, set aside while the except/finally blocks run Python
 * code (PyErr_Fetch before 3.12, PyErr_GetRaisedException since). */
#if PY_VERSION_HEX >= 0x030C0000
typedef PyObject *saved_error;

static inline saved_error
error_save(void)
{
    return PyErr_GetRaisedException();
}

static inline int
error_pending(saved_error error)
{
    return error != NULL;
}

static inline void
error_restore(saved_error error)
{
    PyErr_SetRaisedException(error);
}

/* The block raised: its exception gets the saved one as its context, as in Python. */
static void
error_chain(saved_error error)
{
    if (error != NULL) {
        PyObject *raised = PyErr_GetRaisedException();
        PyException_SetContext(raised, error); /* steals error */
        PyErr_SetRaisedException(raised);
    }
}
#else
typedef struct {
    PyObject *type, *value, *traceback;
} saved_error;

static inline saved_error
error_save(void)
{
    saved_error error;
    PyErr_Fetch(&error.type, &error.value, &error.traceback);
    return error;
}

static inline int
error_pending(saved_error error)
{
    return error.type != NULL;
}

static inline void
error_restore(saved_error error)
{
    PyErr_Restore(error.type, error.value, error.traceback);
}

/* The block raised: its exception gets the saved one as its context, as in Python. */
static void
error_chain(saved_error error)
{
    if (error.type == NULL) {
        return;
    }
    PyErr_NormalizeException(&error.type, &error.value, &error.traceback);
    if (error.traceback != NULL) {
        PyException_SetTraceback(error.value, error.traceback);
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    PyException_SetContext(value, error.value); /* steals error.value */
    Py_DECREF(error.type);
    Py_XDECREF(error.traceback);
    PyErr_Restore(type, value, traceback);
}
#endif

/* ``self.<name> += value`` (value: a new reference, consumed). */
static int
add_to_attribute(PyObject *obj, PyObject *name, PyObject *value)
{
    PyObject *old = value == NULL ? NULL : PyObject_GetAttr(obj, name);
    PyObject *new = old == NULL ? NULL : PyNumber_InPlaceAdd(old, value);
    Py_XDECREF(old);
    Py_XDECREF(value);
    int result = new == NULL ? -1 : PyObject_SetAttr(obj, name, new);
    Py_XDECREF(new);
    return result;
}

/* The ``finally`` block: resumed.clear() and the three counters.  Runs with any
 * exception of the loop fetched; an error here is chained to it, as in Python. */
static int
run_finally(RunState *st)
{
    saved_error error = error_save();
    PyDict_Clear(st->resumed);
    int failed = add_to_attribute(st->adv.engine, str_generated_tokens, PyLong_FromSsize_t(st->adv.generated)) < 0 ||
                 flush_bucket(st) < 0 ||
                 add_to_attribute(st->histogram, str_sum, PyFloat_FromDouble(st->itl_sum)) < 0;
    if (failed) {
        error_chain(error);
        return -1;
    }
    int raising = error_pending(error);
    error_restore(error);
    return raising ? -1 : 0;
}

/* The ``except BaseException`` block: what the loop has not reached (``list(rest)``,
 * the items after index ``next``) goes back to the timetable. */
static void
put_back(RunState *st, PyObject *due, Py_ssize_t next)
{
    saved_error error = error_save();
    PyObject *rest = PyList_GetSlice(st->jobs, next, PY_SSIZE_T_MAX);
    PyObject *args[5] = {NULL, st->adv.engine, rest, st->time, due};
    if (rest == NULL || call_engine(str_put_back, args + 1, 4) < 0) {
        Py_XDECREF(rest);
        error_chain(error);
        return;
    }
    Py_DECREF(rest);
    error_restore(error);
}

/* The prefetch hints for the jobs after ``jobs[next]`` (speedups.h, "Prefetching"): the
 * job LLMSIM_PREFETCH_AHEAD places on, and the links of its output nearer. */
static void
prefetch_ahead(PyObject *jobs, Py_ssize_t next)
{
    for (int ahead = 1; ahead <= LLMSIM_PREFETCH_AHEAD && next + ahead < PyList_GET_SIZE(jobs); ahead++) {
        PyObject *job = PyList_GET_ITEM(jobs, next + ahead);
        if (ahead == LLMSIM_PREFETCH_AHEAD) {
            llmsim_prefetch(job, ((PyTypeObject *)job_type)->tp_basicsize);
        } else if (Py_IS_TYPE(job, (PyTypeObject *)job_type)) {
            llmsim_prefetch_output(job, LLMSIM_SLOT(job, off_emitted), ahead);
        }
    }
}

/* Engine._run(self, jobs, time, now, due, reach) */
static PyObject *
engine_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs != 5 || kwnames != NULL || pure_run == NULL) {
        return llmsim_call_with_self(pure_run, self, args, nargs, kwnames);
    }
    RunState st = {.adv = {.engine = self}};
    if (!run_state_init(&st, args)) {
        run_state_clear(&st);
        PyErr_Clear(); /* the pure twin raises it again, or takes the call */
        return llmsim_call_with_self(pure_run, self, args, nargs, kwnames);
    }
    PyObject *jobs = st.jobs;
    Py_ssize_t next = 0; /* the list iterator's position */
    while (next < PyList_GET_SIZE(jobs)) {
        PyObject *job = PyList_GET_ITEM(jobs, next);
        prefetch_ahead(jobs, next);
        next += 1;
        Py_INCREF(job);
        int result;
        if (Py_IS_TYPE(job, (PyTypeObject *)job_type)) {
            result = run_job(&st, job);
        } else {
            PyErr_Format(PyExc_TypeError, "engine _run (C): an entry is a %.200s, not a Job", Py_TYPE(job)->tp_name);
            result = -1;
        }
        Py_DECREF(job);
        if (result < 0) {
            put_back(&st, args[3], next); /* a sink raised: the rest is still due */
            break;
        }
    }
    int failed = run_finally(&st);
    run_state_clear(&st);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef engine_run_def = {
    "_run",
    (PyCFunction)(void (*)(void))engine_run,
    METH_FASTCALL | METH_KEYWORDS,
    "Engine._run in C (native/engine_run.c); the pure twin is llmsim.engine.scheduler.PURE_RUN.",
};

/* --- install ----------------------------------------------------------------------- */

static int
job_offsets(PyObject *cls)
{
    static const char *const names[] = {"slot", "paused", "emitted", "state", "last_token_time", "deadline", "sink"};
    Py_ssize_t *const offsets[] = {&off_slot,   &off_paused, &off_emitted, &off_state, &off_last_token_time,
                                   &off_deadline, &off_sink};
    return llmsim_slot_offsets(cls, names, offsets, LLMSIM_COUNT(names));
}

/* install_engine_run(Engine, Job, pure_run, PREFILL, DECODING, READY) */
static PyObject *
install_engine_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 6 || !PyType_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "install_engine_run(Engine, Job, pure_run, PREFILL, DECODING, READY): expected two classes and four objects");
        return NULL;
    }
    if (job_offsets(args[1]) < 0) {
        return NULL;
    }
    PyObject **targets[] = {&job_type, &pure_run, &state_prefill, &state_decoding, &ready_slot};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(args[i + 1]);
        Py_XSETREF(*targets[i], args[i + 1]);
    }
    if (llmsim_install_method(args[0], &engine_run_def) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef functions[] = {
    {"install_engine_run", (PyCFunction)(void (*)(void))install_engine_run, METH_FASTCALL,
     "install_engine_run(Engine, Job, pure_run, PREFILL, DECODING, READY): make Engine._run the C twin."},
    {NULL, NULL, 0, NULL},
};

int
llmsim_engine_init(PyObject *module)
{
    static const llmsim_name names[] = {
        {&str_latency, "_latency"},
        {&str_fixed_itl, "fixed_itl"},
        {&str_metrics, "metrics"},
        {&str_inter_token_latency, "inter_token_latency"},
        {&str_bounds, "bounds"},
        {&str_counts, "counts"},
        {&str_sum, "sum"},
        {&str_ready, "_ready"},
        {&str_resumed, "_resumed"},
        {&str_generated_tokens, "_generated_tokens"},
        {&str_start_decoding, "_start_decoding"},
        {&str_advance, "_advance"},
        {&str_put_back, "_put_back"},
        {&str_on_output, "on_output"},
    };
    if (llmsim_intern_names(names, LLMSIM_COUNT(names)) < 0 || llmsim_engine_advance_init(module) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, functions);
}
