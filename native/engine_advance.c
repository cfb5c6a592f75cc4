/* The C twin of Engine._advance (llmsim/engine/scheduler.py) and Timetable._enter
 * (llmsim/engine/timetable.py) for the engine loop of engine_run.c.
 *
 * Taken in C, for a job the loop has handed its tokens' start: the count of tokens due
 * by the step's reach and the deadline after them (LatencyModel.due_tokens with a
 * fixed ITL: additions and comparisons, bit for bit the Python floats), the job's new
 * ``emitted``, and its next entry: _run's inlined one-token case and the catch-ups of
 * several tokens alike go through the remembered grid span (first, last, slot, bucket),
 * and a deadline outside it through Timetable._enter's twin (its grid or exact time,
 * grid.py:grid_span, the bucket's dict entry, heapq.heappush).  Handed to Python: the
 * job's end (Engine._finish), an entry in the ready list (Engine._enter_ready, the
 * per-step cap hit), _enter's ready-list case (a grid time not after ``now``), and
 * whatever is unusual: no fixed ITL with two tokens or more left (Engine._advance), an
 * engine whose _advance or _enter is not the classes' own, a latency model not a
 * LatencyModel or replaced mid-call, grid fields not floats, a non-finite value where
 * the Python code would raise.
 */
#include "speedups.h"

#include <math.h>

/* --- given at install (install_engine_advance) ------------------------------------- */
static PyObject *latency_type;  /* llmsim.engine.latency.LatencyModel */
static PyObject *pure_advance;  /* Engine._advance (the function) */
static PyObject *pure_enter;    /* Timetable._enter (the function) */
static PyObject *heappush;      /* heapq.heappush */
static Py_ssize_t cap;          /* scheduler.MAX_TOKENS_PER_STEP */
static double grid_shift;       /* grid.GRID_SHIFT */
static double grid_tolerance;   /* grid.GRID_TOLERANCE */
static Py_ssize_t off_slot, off_emitted, off_output, off_deadline;

/* --- interned names (llmsim_engine_advance_init) ----------------------------------- */
static PyObject *str_advance, *str_enter, *str_finish, *str_enter_ready, *str_latency, *str_grid,
    *str_inverse_grid, *str_buckets, *str_times, *str_append;

void
llmsim_advance_clear(llmsim_advance *adv)
{
    Py_CLEAR(adv->latency);
    Py_CLEAR(adv->slot);
    Py_CLEAR(adv->bucket);
}

/* --- small helpers ------------------------------------------------------------------ */

/* ``list.append(item)`` for a bucket (a list, or whatever the engine's dict held). */
static inline int
append(PyObject *bucket, PyObject *item)
{
    if (PyList_CheckExact(bucket)) {
        return PyList_Append(bucket, item);
    }
    PyObject *result = PyObject_CallMethodOneArg(bucket, str_append, item);
    Py_XDECREF(result);
    return result == NULL ? -1 : 0;
}

/* engine.<name>(args...) (args[1] is the engine, args[0] free), the result discarded; 0 or -1. */
static int
call_engine(PyObject *name, PyObject **args, size_t nargs)
{
    PyObject *result = PyObject_VectorcallMethod(name, args + 1, nargs | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_XDECREF(result);
    return result == NULL ? -1 : 0;
}

/* Whether ``engine.<name>`` is ``function`` itself bound to the engine: the method the
 * C code mirrors, neither overridden by a subclass nor set on the instance. */
static int
own_method(PyObject *engine, PyObject *name, PyObject *function)
{
    PyObject *method = PyObject_GetAttr(engine, name);
    if (method == NULL) {
        PyErr_Clear(); /* the Python call raises it again */
        return 0;
    }
    int own = function != NULL && PyMethod_Check(method) && PyMethod_GET_FUNCTION(method) == function &&
              PyMethod_GET_SELF(method) == engine;
    Py_DECREF(method);
    return own;
}

/* An engine field that must be an exact float: its value in ``out``, else 0 (no
 * exception: the Python method reads it again). */
static int
float_field(PyObject *engine, PyObject *name, double *out)
{
    PyObject *value = PyObject_GetAttr(engine, name);
    int plain = value != NULL && PyFloat_CheckExact(value);
    if (plain) {
        *out = PyFloat_AS_DOUBLE(value);
    }
    Py_XDECREF(value);
    PyErr_Clear();
    return plain;
}

/* ``value * factor - shift`` rounded as Python rounds it: the product first (stored,
 * so that no compiler fuses it with the difference into one fma). */
static inline double
scaled(double value, double factor, double shift)
{
    volatile double product = value * factor;
    return product - shift;
}

/* --- Timetable._enter (timetable.py) --------------------------------------------- */

/* The grid case: ``time = math.ceil(deadline * inverse_grid - GRID_SHIFT) * grid`` and
 * the span of deadlines that get it (grid.py:grid_span, then widened to ``deadline``);
 * 0 where the Python method takes over: the ready list (``time <= now``) or a value
 * for which math.ceil raises. */
static int
grid_entry(double deadline, double grid, double inverse, double now, double *time, double *first, double *last)
{
    if (!isfinite(grid) || !isfinite(inverse)) {
        return 0;
    }
    double rounded = scaled(deadline, inverse, grid_shift);
    if (!isfinite(rounded)) {
        return 0;
    }
    double index = ceil(rounded) + 0.0; /* + 0.0: int(-0.0) * grid is 0.0, not -0.0 */
    *time = index * grid;
    if (!isfinite(*time) || *time <= now) {
        return 0;
    }
    double low = (index - 0.5 + 2.0 * grid_tolerance) * grid, high = (index + 0.5) * grid;
    double low_rounded = scaled(low, inverse, grid_shift), high_rounded = scaled(high, inverse, grid_shift);
    if (!isfinite(low_rounded) || !isfinite(high_rounded)) {
        return 0;
    }
    *first = ceil(low_rounded) == index ? low : Py_HUGE_VAL;
    *last = ceil(high_rounded) == index ? high : -Py_HUGE_VAL;
    if (deadline < *first) { /* min(first, deadline) */
        *first = deadline;
    }
    if (deadline > *last) { /* max(last, deadline) */
        *last = deadline;
    }
    return 1;
}

/* ``bucket = self._buckets.get(time)``: a new one (and ``heapq.heappush(self._times,
 * time)``) or the job appended; the bucket (a new reference) or NULL. */
static PyObject *
bucket_entry(PyObject *engine, PyObject *buckets, PyObject *job, PyObject *time)
{
    PyObject *bucket = PyDict_GetItemWithError(buckets, time);
    if (bucket != NULL) {
        Py_INCREF(bucket);
        if (append(bucket, job) < 0) {
            Py_CLEAR(bucket);
        }
        return bucket;
    }
    if (PyErr_Occurred() || (bucket = PyList_New(1)) == NULL) {
        return NULL;
    }
    Py_INCREF(job);
    PyList_SET_ITEM(bucket, 0, job);
    PyObject *times = PyDict_SetItem(buckets, time, bucket) < 0 ? NULL : PyObject_GetAttr(engine, str_times);
    PyObject *args[2] = {times, time};
    PyObject *pushed = times == NULL ? NULL : PyObject_Vectorcall(heappush, args, 2, NULL);
    Py_XDECREF(times);
    if (pushed == NULL) {
        Py_CLEAR(bucket);
    }
    Py_XDECREF(pushed);
    return bucket;
}

/* Timetable._enter(job, deadline, now) but its ready-list case, the span going to the
 * cache: 1, 0 (not taken: nothing done, no exception), or -1 with an exception. */
static int
timetable_enter(llmsim_advance *adv, PyObject *job, PyObject *deadline, double deadline_value)
{
    double grid, inverse, time_value = deadline_value, first = deadline_value, last = deadline_value;
    if (!float_field(adv->engine, str_grid, &grid)) {
        return 0;
    }
    if (grid != 0.0 && !(float_field(adv->engine, str_inverse_grid, &inverse) &&
                         grid_entry(deadline_value, grid, inverse, adv->now_value, &time_value, &first, &last))) {
        return 0;
    }
    PyObject *buckets = PyObject_GetAttr(adv->engine, str_buckets);
    if (buckets == NULL || !PyDict_CheckExact(buckets)) {
        Py_XDECREF(buckets);
        PyErr_Clear();
        return 0;
    }
    PyObject *time = grid != 0.0 ? PyFloat_FromDouble(time_value) : Py_NewRef(deadline);
    if (time == NULL) {
        Py_DECREF(buckets);
        return -1;
    }
    llmsim_slot_set(job, off_slot, time);
    PyObject *bucket = bucket_entry(adv->engine, buckets, job, time);
    Py_DECREF(buckets);
    if (bucket == NULL) {
        Py_DECREF(time);
        return -1;
    }
    adv->first = first;
    adv->last = last;
    Py_SETREF(adv->slot, time);
    Py_SETREF(adv->bucket, bucket);
    return 1;
}

/* ``first, last, slot, bucket = self._enter(job, deadline, now)``, the Python method. */
static int
python_enter(llmsim_advance *adv, PyObject *job, PyObject *deadline)
{
    PyObject *args[5] = {NULL, adv->engine, job, deadline, adv->now};
    PyObject *entry = PyObject_VectorcallMethod(str_enter, args + 1, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (entry == NULL) {
        return -1;
    }
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4 || !PyFloat_CheckExact(PyTuple_GET_ITEM(entry, 0)) ||
        !PyFloat_CheckExact(PyTuple_GET_ITEM(entry, 1))) {
        PyErr_Format(PyExc_TypeError, "engine _run (C): _enter returned %R, not (first, last, slot, bucket)", entry);
        Py_DECREF(entry);
        return -1;
    }
    adv->first = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(entry, 0));
    adv->last = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(entry, 1));
    Py_SETREF(adv->slot, Py_NewRef(PyTuple_GET_ITEM(entry, 2)));
    Py_SETREF(adv->bucket, Py_NewRef(PyTuple_GET_ITEM(entry, 3)));
    Py_DECREF(entry);
    return 0;
}

/* The entry of a job due at ``deadline`` (past the reach): from the cache when the span
 * of the last time given out holds it, else from _enter (its C twin, or the method). */
static int
enter(llmsim_advance *adv, PyObject *job, PyObject *deadline, double deadline_value)
{
    if (adv->first <= deadline_value && deadline_value <= adv->last) {
        llmsim_slot_set(job, off_slot, adv->slot);
        return append(adv->bucket, job);
    }
    if (adv->enter_in_c < 0) {
        adv->enter_in_c = own_method(adv->engine, str_enter, pure_enter);
    }
    int taken = adv->enter_in_c ? timetable_enter(adv, job, deadline, deadline_value) : 0;
    return taken ? (taken < 0 ? -1 : 0) : python_enter(adv, job, deadline);
}

/* --- Engine._advance (scheduler.py), and _run's inlined case ----------------------- */

/* _run's inlined case: the job's next token, ``stop``, is due at ``deadline`` (past the
 * reach): emitted, the count, deadline, and its entry. */
static PyObject *
next_token(llmsim_advance *adv, PyObject *job, Py_ssize_t stop_value, double deadline_value)
{
    PyObject *stop = PyLong_FromSsize_t(stop_value);
    if (stop == NULL) {
        return NULL;
    }
    llmsim_slot_set(job, off_emitted, stop);
    adv->generated += 1;
    PyObject *deadline = PyFloat_FromDouble(deadline_value);
    if (deadline == NULL) {
        Py_DECREF(stop);
        return NULL;
    }
    llmsim_slot_set(job, off_deadline, deadline);
    int result = enter(adv, job, deadline, deadline_value);
    Py_DECREF(deadline);
    if (result < 0) {
        Py_CLEAR(stop);
    }
    return stop;
}

/* LatencyModel.due_tokens (latency.py) with a fixed ITL: how many of ``remaining`` (at
 * least 2) tokens, the first due at ``*deadline``, are due by the reach (at most the
 * cap); ``*deadline`` becomes the one that follows. */
static Py_ssize_t
due_tokens(llmsim_advance *adv, double *deadline, Py_ssize_t remaining)
{
    Py_ssize_t count = 1;
    while (1) {
        *deadline += adv->fixed_itl;
        if (*deadline > adv->reach_value || count == cap) {
            break;
        }
        count += 1;
        if (count == remaining) {
            break;
        }
    }
    return count;
}

/* Whether the rest of Engine._advance may run here: the engine's _advance is the
 * class's own and, for a count of tokens, its latency model the LatencyModel the call
 * began with (a sink may have reconfigured the engine: Python would read the new one). */
static int
advance_in_c(llmsim_advance *adv, int uses_latency)
{
    if (adv->advance_in_c < 0) {
        adv->advance_in_c = own_method(adv->engine, str_advance, pure_advance);
    }
    if (!adv->advance_in_c || !uses_latency) {
        return adv->advance_in_c;
    }
    PyObject *latency = PyObject_GetAttr(adv->engine, str_latency);
    int same = latency == adv->latency && Py_IS_TYPE(latency, (PyTypeObject *)latency_type);
    Py_XDECREF(latency);
    PyErr_Clear();
    return same;
}

/* The end of Engine._advance once ``job.emitted = stop``: ``self._finish(job, now,
 * deadline)`` when no token is left, else the job's next entry; 0 or -1. */
static int
advance_end(llmsim_advance *adv, PyObject *job, int finished, PyObject *deadline, double deadline_value)
{
    if (finished) {
        PyObject *args[5] = {NULL, adv->engine, job, adv->now, deadline};
        return call_engine(str_finish, args, 4);
    }
    llmsim_slot_set(job, off_deadline, deadline);
    if (deadline_value > adv->reach_value) { /* its grid time, after ``now`` (the span cache or _enter) */
        return enter(adv, job, deadline, deadline_value);
    }
    PyObject *args[4] = {NULL, adv->engine, job, deadline}; /* the per-job cap was hit: the next step */
    return call_engine(str_enter_ready, args, 3);
}

/* Engine._advance for ``count`` tokens from ``start``, the one after them due at
 * ``deadline`` (the last one's when none remain): the new ``stop`` or NULL. */
static PyObject *
advance(llmsim_advance *adv, PyObject *job, Py_ssize_t stop_value, int finished, PyObject *deadline,
        double deadline_value)
{
    PyObject *stop = PyLong_FromSsize_t(stop_value);
    if (stop == NULL) {
        return NULL;
    }
    llmsim_slot_set(job, off_emitted, stop);
    if (advance_end(adv, job, finished, deadline, deadline_value) < 0) {
        Py_CLEAR(stop); /* _advance raised: _run does not count its tokens */
    }
    return stop;
}

int
llmsim_advance_job(llmsim_advance *adv, PyObject *job, Py_ssize_t start, PyObject **stop)
{
    PyObject *output = llmsim_job_field(job, off_output, "output");
    Py_ssize_t total = output == NULL                ? -1
                       : PyTuple_CheckExact(output) ? PyTuple_GET_SIZE(output)
                                                    : PyObject_Size(output);
    if (total < 0) {
        return -1;
    }
    Py_ssize_t remaining = total - start, count;
    if (remaining >= 2 && adv->has_fixed_itl) {
        double deadline;
        if (llmsim_job_time(job, off_deadline, "deadline", &deadline) < 0) {
            return -1;
        }
        count = due_tokens(adv, &deadline, remaining);
        if (count == 1 && deadline > adv->reach_value) {
            *stop = next_token(adv, job, start + 1, deadline);
        } else if (advance_in_c(adv, 1)) {
            PyObject *next = PyFloat_FromDouble(deadline);
            *stop = next == NULL ? NULL : advance(adv, job, start + count, count == remaining, next, deadline);
            Py_XDECREF(next);
            adv->generated += *stop == NULL ? 0 : count;
        } else {
            return 0;
        }
    } else if (remaining == 1 && advance_in_c(adv, 0)) { /* the last token: _finish with its deadline */
        PyObject *deadline = llmsim_job_field(job, off_deadline, "deadline");
        if (deadline == NULL) {
            return -1;
        }
        Py_INCREF(deadline); /* held, as in the Python frame, while _finish runs */
        *stop = advance(adv, job, total, 1, deadline, 0.0);
        Py_DECREF(deadline);
        adv->generated += *stop == NULL ? 0 : 1;
    } else {
        return 0;
    }
    return *stop == NULL ? -1 : 1;
}

/* --- install ----------------------------------------------------------------------- */

static int
job_offsets(PyObject *cls)
{
    static const char *const names[] = {"slot", "emitted", "output", "deadline"};
    Py_ssize_t *const offsets[] = {&off_slot, &off_emitted, &off_output, &off_deadline};
    return llmsim_slot_offsets(cls, names, offsets, LLMSIM_COUNT(names));
}

/* install_engine_advance(Job, LatencyModel, advance, enter, cap, GRID_SHIFT, GRID_TOLERANCE, heappush) */
static PyObject *
install_engine_advance(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyFunction_Check(args[2]) ||
        !PyFunction_Check(args[3]) || !PyLong_CheckExact(args[4]) || !PyFloat_CheckExact(args[5]) ||
        !PyFloat_CheckExact(args[6]) || !PyCallable_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "install_engine_advance(Job, LatencyModel, advance, enter, cap, "
                                         "GRID_SHIFT, GRID_TOLERANCE, heappush): expected two classes, two "
                                         "functions, an int, two floats and a callable");
        return NULL;
    }
    Py_ssize_t given_cap = PyLong_AsSsize_t(args[4]);
    if ((given_cap == -1 && PyErr_Occurred()) || job_offsets(args[0]) < 0) {
        return NULL;
    }
    PyObject **targets[] = {&latency_type, &pure_advance, &pure_enter};
    for (int i = 0; i < 3; i++) {
        Py_XSETREF(*targets[i], Py_NewRef(args[i + 1]));
    }
    Py_XSETREF(heappush, Py_NewRef(args[7]));
    cap = given_cap;
    grid_shift = PyFloat_AS_DOUBLE(args[5]);
    grid_tolerance = PyFloat_AS_DOUBLE(args[6]);
    Py_RETURN_NONE;
}

static PyMethodDef functions[] = {
    {"install_engine_advance", (PyCFunction)(void (*)(void))install_engine_advance, METH_FASTCALL,
     "install_engine_advance(Job, LatencyModel, advance, enter, cap, GRID_SHIFT, GRID_TOLERANCE, heappush): "
     "what the engine loop's C twin of Engine._advance and Timetable._enter needs."},
    {NULL, NULL, 0, NULL},
};

int
llmsim_engine_advance_init(PyObject *module)
{
    static const llmsim_name names[] = {
        {&str_advance, "_advance"},   {&str_enter, "_enter"},   {&str_finish, "_finish"},
        {&str_enter_ready, "_enter_ready"}, {&str_latency, "_latency"}, {&str_grid, "_grid"},
        {&str_inverse_grid, "_inverse_grid"}, {&str_buckets, "_buckets"}, {&str_times, "_times"},
        {&str_append, "append"},
    };
    if (llmsim_intern_names(names, LLMSIM_COUNT(names)) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, functions);
}
