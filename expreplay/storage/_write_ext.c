/* Optional accelerator: the ring's common writes (expreplay/storage/ring.py), in one call each.
 *
 * Why C: a step of one lane (LaneWriter.add_step) costs ~40 numpy calls of ~1 microsecond each
 * on the numpy path (BatchWriter.add_steps), against tensorpack's original append of ~1.5
 * microseconds. A Store, bound once by BlockRing.bind_kernel to the ring's tables and one
 * writer's cursors, does the common case in one call: a single lane's step (its arguments'
 * checks included) or episode start, or a step of many lanes none of which ends its episode.
 *
 * It is the ring's delegated implementation (BlockRing.bind_kernel) and writes exactly what
 * BlockRing.append / start would, the ring's counts and its distribution's queue of published
 * slots included. Each call takes the ring's lock and releases it here, in C: no Python code
 * runs between the two, so no exception (a signal's KeyboardInterrupt) can land part-way and
 * leave the tables half-written or the lock held. It handles only the common case and changes
 * nothing (returns -1) when a lane needs more: its block is full, its current slot lies near a
 * block start where the previous block may be gone (I3/I5 of ring.py), an argument is not of
 * the exact kind it takes, a reward is not a finite float32, the queue of published slots is
 * full, or the ring's journal holds a write an exception cut short (the Python path finishes
 * it first). The numpy path then runs, which handles everything and is the reference this
 * kernel is tested against.
 *
 * Plain CPython C API + buffer protocol (no numpy headers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define HAS_ACTION_VALID 9   /* ring.py's _slots: _HAS_ACTION | _VALID */

typedef struct {
    Py_buffer b;
    int ok;
} Buf;

static int get(PyObject *obj, Buf *buf, int writable, Py_ssize_t itemsize, Py_ssize_t min_items,
               const char *name)
{
    buf->ok = 0;
    if (PyObject_GetBuffer(obj, &buf->b, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    buf->ok = 1;
    if (itemsize && buf->b.len < itemsize * min_items) {
        PyErr_Format(PyExc_ValueError, "%s is too small", name);
        return -1;
    }
    return 0;
}

static void release(Buf *bufs, int n)
{
    for (int i = 0; i < n; i++)
        if (bufs[i].ok)
            PyBuffer_Release(&bufs[i].b);
}


/* ------------------------------------------------------------------ Store: the write binding
 *
 * The ring's tables (frames, epstep, flags, action, reward, block_fill, and for reading
 * block_gen, block_state, block_prev_intact) bound with one writer's per-lane cursors (next
 * slot, current slot, its epstep and block offset, the active block, `safe`, the calls left
 * before some lane may need a new block, and the current slot's block generation:
 * expreplay/storage/writers.py). Built once per writer, so that a step is one call with the
 * step's values only. */

enum { S_FRAMES, S_EPSTEP, S_FLAGS, S_ACTION, S_REWARD, S_FILL, S_GEN, S_STATE, S_INTACT,
       S_NEXT, S_CUR, S_EP, S_OFF, S_BLOCK, S_SAFE, S_CURGEN, S_NBUF };
#define N_MEM_TABLES 9
#define N_WRITER_TABLES 7
#define BLOCK_FREE 0   /* ring.py's _slots: _FREE */

typedef struct {
    PyObject_HEAD
    Py_buffer b[S_NBUF];
    int ok[S_NBUF];
    PyObject *acquire, *release;   /* the ring's lock's bound methods */
    Py_buffer journal, counts;     /* uint8[1]: a write is pending; int64[2]: valid, written */
    int journal_ok, counts_ok;
    PyObject *published;           /* the distribution's queue of published slots, or NULL */
    Py_ssize_t publish_limit;
    Py_ssize_t fb, h, bs, nslots, nblocks, nlanes;
    char format[8];           /* the frames' buffer format ("" : no one-step fast path) */
    int ndim;
    Py_ssize_t shape[4];
} StoreObject;

static void Store_dealloc(StoreObject *st)
{
    for (int i = 0; i < S_NBUF; i++)
        if (st->ok[i])
            PyBuffer_Release(&st->b[i]);
    if (st->journal_ok)
        PyBuffer_Release(&st->journal);
    if (st->counts_ok)
        PyBuffer_Release(&st->counts);
    Py_XDECREF(st->acquire);
    Py_XDECREF(st->release);
    Py_XDECREF(st->published);
    Py_TYPE(st)->tp_free((PyObject *)st);
}

static int Store_init(StoreObject *st, PyObject *args, PyObject *kw)
{
    PyObject *mem, *wri, *shape, *lock, *journal, *counts, *published;
    const char *format;
    (void)kw;
    if (st->ok[0]) {
        PyErr_SetString(PyExc_TypeError, "Store is initialised once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!O!sO!nn(OOOOn):Store", &PyTuple_Type, &mem, &PyTuple_Type,
                          &wri, &format, &PyTuple_Type, &shape, &st->h, &st->bs, &lock, &journal,
                          &counts, &published, &st->publish_limit))
        return -1;
    st->acquire = PyObject_GetAttrString(lock, "acquire");
    st->release = PyObject_GetAttrString(lock, "release");
    if (!st->acquire || !st->release)
        return -1;
    if (PyObject_GetBuffer(journal, &st->journal, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return -1;
    st->journal_ok = 1;
    if (PyObject_GetBuffer(counts, &st->counts, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return -1;
    st->counts_ok = 1;
    if (st->journal.len != 1 || st->counts.len != 16 || st->counts.itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "Store: a 1-byte journal flag and 2 int64 counts");
        return -1;
    }
    if (published != Py_None) {
        if (!PyList_CheckExact(published)) {
            PyErr_SetString(PyExc_TypeError, "Store: the published slots are a list or None");
            return -1;
        }
        Py_INCREF(published);
        st->published = published;
    }
    if (PyTuple_GET_SIZE(mem) != N_MEM_TABLES || PyTuple_GET_SIZE(wri) != N_WRITER_TABLES) {
        PyErr_SetString(PyExc_ValueError, "Store: 9 ring tables and 7 writer tables");
        return -1;
    }
    static const Py_ssize_t item[S_NBUF] = {1, 4, 1, 4, 4, 8, 8, 1, 1, 8, 8, 8, 8, 8, 8, 8};
    for (int i = 0; i < S_NBUF; i++) {
        PyObject *o = i < S_NEXT ? PyTuple_GET_ITEM(mem, i) : PyTuple_GET_ITEM(wri, i - S_NEXT);
        int writable = i != S_BLOCK && i != S_GEN && i != S_STATE && i != S_INTACT;
        if (PyObject_GetBuffer(o, &st->b[i], PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
            return -1;
        st->ok[i] = 1;
        if (item[i] > 1 && st->b[i].itemsize != item[i]) {
            PyErr_Format(PyExc_ValueError, "Store: table %d has items of the wrong size", i);
            return -1;
        }
    }
    st->nslots = st->b[S_EPSTEP].len / 4;
    st->nblocks = st->b[S_FILL].len / 8;
    st->nlanes = st->b[S_NEXT].len / 8;
    st->fb = st->nslots ? st->b[S_FRAMES].len / (st->nslots + 1) : 0;
    int bad = st->h < 1 || st->bs < 1 || st->nblocks * st->bs != st->nslots || st->fb < 1
        || st->b[S_FRAMES].len != (st->nslots + 1) * st->fb || st->b[S_FLAGS].len != st->nslots
        || st->b[S_ACTION].len != 4 * st->nslots || st->b[S_REWARD].len != 4 * st->nslots
        || st->b[S_SAFE].len != 8;
    for (int i = S_CUR; i <= S_BLOCK; i++)
        bad |= st->b[i].len != 8 * st->nlanes;
    bad |= st->b[S_CURGEN].len != 8 * st->nlanes || st->b[S_GEN].len != 8 * st->nblocks
        || st->b[S_STATE].len != st->nblocks || st->b[S_INTACT].len != st->nblocks;
    st->ndim = (int)PyTuple_GET_SIZE(shape);
    bad |= st->ndim < 1 || st->ndim > 4 || strlen(format) >= sizeof(st->format);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "Store: inconsistent table sizes");
        return -1;
    }
    Py_ssize_t total = 1;
    for (int d = 0; d < st->ndim; d++) {
        st->shape[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (st->shape[d] < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "Store: bad frame shape");
            return -1;
        }
        total *= st->shape[d];
    }
    strcpy(st->format, format);
    return 0;
}

/* The frame of one step, if it is exactly the memory's: a C-contiguous buffer of the frame
 * shape and the memory's format. 1 (view filled), 0 (not such a frame: the numpy path). */
static int exact_frame(StoreObject *st, PyObject *obj, Py_buffer *view)
{
    if (!st->format[0] || !PyObject_CheckBuffer(obj))
        return 0;
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = view->format ? view->format : "B";
    int ok = view->ndim == st->ndim && view->len == st->fb && strcmp(f, st->format) == 0;
    for (int d = 0; ok && d < st->ndim; d++)
        ok = view->shape[d] == st->shape[d];
    if (!ok)
        PyBuffer_Release(view);
    return ok;
}

/* The ring's lock, taken and given back around each write (0, or -1 with an exception set:
 * an interrupted wait for the lock raises there, before anything is written). */
static int lock_ring(StoreObject *st)
{
    PyObject *r = PyObject_CallNoArgs(st->acquire);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *str_acquire, *str_release, *str_finish;

/* A lock given back after a call: `release` (a bound method), or `lock.release()` when it is
 * NULL. The call's own error, if one is set, is raised after; returns `result`, or NULL
 * (`result` dropped) when the release itself fails. */
static PyObject *release_after(PyObject *release, PyObject *lock, PyObject *result)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = release ? PyObject_CallNoArgs(release)
                          : PyObject_CallMethodNoArgs(lock, str_release);
    if (!r) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        Py_XDECREF(result);
        return NULL;
    }
    Py_DECREF(r);
    PyErr_Restore(type, value, tb);
    return result;
}

static PyObject *unlock_ring(StoreObject *st, PyObject *result)
{
    return release_after(st->release, NULL, result);
}

static PyObject *step_locked(StoreObject *st, PyObject *frame, int32_t action, float reward,
                             uint8_t ends);
static PyObject *start_locked(StoreObject *st, PyObject *frame);

/* Whether a write may go ahead: no write cut short pending in the journal, and room in the
 * queue of published slots for `n` more. */
static int may_write(StoreObject *st, Py_ssize_t n)
{
    if (((const uint8_t *)st->journal.buf)[0])
        return 0;
    return !st->published || PyList_GET_SIZE(st->published) + n < st->publish_limit;
}

/* Append `slot` to the queue of published slots (when the distribution keeps one). */
static int publish(StoreObject *st, int64_t slot)
{
    if (!st->published)
        return 0;
    PyObject *v = PyLong_FromLongLong(slot);
    if (!v)
        return -1;
    int r = PyList_Append(st->published, v);
    Py_DECREF(v);
    return r;
}

PyDoc_STRVAR(store_step_doc,
"step(action, reward, frame, terminated, truncated) -> the slot the step was taken from, or -1\n\n"
"LaneWriter.add_step's common case for lane 0: an int action within int32, a float reward (or\n"
"an int float32 holds exactly) within float32's range, a frame of exactly the memory's shape and\n"
"dtype, C-contiguous, the end flags Python bools, room in the block, and the step from the\n"
"current slot sampleable (I3: its history inside its block, or the lane's previous block\n"
"intact). A step that ends the episode closes the lane (current slot -1), as add_steps does.\n"
"-1 (nothing changed) for anything else: the caller's checks and numpy path run.");

static PyObject *Store_step(StoreObject *st, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "step takes 5 arguments");
        return NULL;
    }
    PyObject *ao = args[0], *ro = args[1], *to = args[3], *tr = args[4];
    if ((to != Py_False && to != Py_True) || (tr != Py_False && tr != Py_True)
        || !PyLong_CheckExact(ao))
        return PyLong_FromLong(-1);
    const uint8_t ends = (uint8_t)((to == Py_True ? 2 : 0) | (tr == Py_True ? 4 : 0));
    int overflow;
    long long action = PyLong_AsLongLongAndOverflow(ao, &overflow);
    if (overflow || action < INT32_MIN || action > INT32_MAX)
        return PyLong_FromLong(-1);
    double reward;
    if (PyFloat_Check(ro)) {
        reward = PyFloat_AS_DOUBLE(ro);
    } else if (PyLong_CheckExact(ro)) {
        long long v = PyLong_AsLongLongAndOverflow(ro, &overflow);
        if (overflow || v > (1 << 24) || v < -(1 << 24))   /* only ints float32 holds exactly */
            return PyLong_FromLong(-1);
        reward = (double)v;
    } else {
        return PyLong_FromLong(-1);
    }
    if (!(fabs(reward) <= FLT_MAX))
        return PyLong_FromLong(-1);
    if (lock_ring(st) < 0)
        return NULL;
    return unlock_ring(st, step_locked(st, args[2], (int32_t)action, (float)reward, ends));
}

static PyObject *step_locked(StoreObject *st, PyObject *frame, int32_t action, float reward,
                             uint8_t ends)
{
    if (!may_write(st, 1))
        return PyLong_FromLong(-1);
    int64_t *next = st->b[S_NEXT].buf, *cur = st->b[S_CUR].buf, *ep = st->b[S_EP].buf;
    int64_t *off = st->b[S_OFF].buf, *safe = st->b[S_SAFE].buf;
    const int64_t *block = st->b[S_BLOCK].buf;
    int64_t slot = next[0], from = cur[0], bs = st->bs;
    if (*safe <= 0 || from < 0 || from >= st->nslots || block[0] < 0
        || block[0] >= st->nblocks || slot < block[0] * bs || slot >= (block[0] + 1) * bs)
        return PyLong_FromLong(-1);
    if (off[0] < st->h - 1) {
        /* The current slot lies at a block start or in the lane's previous block (which a
         * claim by another writer may have evicted): BatchWriter._publish_carefully's rule.
         * Its block must be the one it was written in, and its history intact. */
        int64_t cb = from / bs, co = from % bs;
        int64_t e = ((const int32_t *)st->b[S_EPSTEP].buf)[from];
        if (((const int64_t *)st->b[S_GEN].buf)[cb] != ((const int64_t *)st->b[S_CURGEN].buf)[0]
            || ((const int8_t *)st->b[S_STATE].buf)[cb] == BLOCK_FREE
            || ((e < st->h - 1 ? e : st->h - 1) > co && !((const uint8_t *)st->b[S_INTACT].buf)[cb]))
            return PyLong_FromLong(-1);
    }
    Py_buffer view;
    if (!exact_frame(st, frame, &view))
        return PyLong_FromLong(-1);
    if (publish(st, from) < 0) {      /* before any store: a failure changes nothing */
        PyBuffer_Release(&view);
        return NULL;
    }
    uint8_t *flags = st->b[S_FLAGS].buf;
    memcpy((uint8_t *)st->b[S_FRAMES].buf + slot * st->fb, view.buf, st->fb);
    PyBuffer_Release(&view);
    ((int32_t *)st->b[S_EPSTEP].buf)[slot] = (int32_t)(ep[0] + 1);
    flags[slot] = 0;
    ((int64_t *)st->b[S_FILL].buf)[block[0]] += 1;
    ((int32_t *)st->b[S_ACTION].buf)[from] = action;
    ((float *)st->b[S_REWARD].buf)[from] = reward;
    flags[from] = HAS_ACTION_VALID | ends;   /* TERMINATED 2, TRUNCATED 4: ring.py's _slots */
    ((int64_t *)st->counts.buf)[0] += 1;
    ((int64_t *)st->counts.buf)[1] += 1;
    next[0] = slot + 1;
    cur[0] = ends ? -1 : slot;               /* an ended episode: the lane is closed */
    ep[0] += 1;
    off[0] = slot - block[0] * bs;
    ((int64_t *)st->b[S_CURGEN].buf)[0] = ((const int64_t *)st->b[S_GEN].buf)[block[0]];
    *safe -= 1;
    return PyLong_FromLongLong(from);
}

PyDoc_STRVAR(store_start_doc,
"start(frame) -> the slot of the episode's first frame, or -1\n\n"
"LaneWriter.start_episode's common case for lane 0: a frame of exactly the memory's shape and\n"
"dtype, C-contiguous, and room in the active block. -1 (nothing changed) otherwise.");

static PyObject *Store_start(StoreObject *st, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "start takes 1 argument");
        return NULL;
    }
    if (lock_ring(st) < 0)
        return NULL;
    return unlock_ring(st, start_locked(st, args[0]));
}

static PyObject *start_locked(StoreObject *st, PyObject *frame)
{
    if (!may_write(st, 0))
        return PyLong_FromLong(-1);
    int64_t *next = st->b[S_NEXT].buf, *cur = st->b[S_CUR].buf, *ep = st->b[S_EP].buf;
    int64_t *off = st->b[S_OFF].buf, *safe = st->b[S_SAFE].buf;
    const int64_t *block = st->b[S_BLOCK].buf;
    int64_t slot = next[0], bs = st->bs;
    if (*safe <= 0 || block[0] < 0 || block[0] >= st->nblocks || slot < block[0] * bs
        || slot >= (block[0] + 1) * bs)
        return PyLong_FromLong(-1);
    Py_buffer view;
    if (!exact_frame(st, frame, &view))
        return PyLong_FromLong(-1);
    memcpy((uint8_t *)st->b[S_FRAMES].buf + slot * st->fb, view.buf, st->fb);
    PyBuffer_Release(&view);
    ((int32_t *)st->b[S_EPSTEP].buf)[slot] = 0;
    ((uint8_t *)st->b[S_FLAGS].buf)[slot] = 0;
    ((int64_t *)st->b[S_FILL].buf)[block[0]] += 1;
    next[0] = slot + 1;
    cur[0] = slot;
    ep[0] = 0;
    off[0] = slot - block[0] * bs;
    ((int64_t *)st->b[S_CURGEN].buf)[0] = ((const int64_t *)st->b[S_GEN].buf)[block[0]];
    *safe -= 1;
    return PyLong_FromLongLong(slot);
}

PyDoc_STRVAR(store_steps_doc,
"steps(lanes, actions, frames, rewards, terminated, truncated) -> n, or -1\n\n"
"A step of each of the lanes (int64 lanes and actions, float64 rewards, bool ends, the frames'\n"
"raw bytes, one frame per lane), none ending its episode, stored as BlockRing.append would;\n"
"-1, having changed nothing, when any lane needs the numpy path.");

static PyObject *Store_steps(StoreObject *st, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "steps takes 6 arguments");
        return NULL;
    }
    Buf a[6];
    memset(a, 0, sizeof(a));
    static const Py_ssize_t sizes[6] = {8, 8, 1, 8, 1, 1};
    static const char *names[6] = {"lanes", "actions", "frames", "rewards", "terminated",
                                   "truncated"};
    if (get(args[0], &a[0], 0, 8, 0, "lanes") < 0) { release(a, 6); return NULL; }
    Py_ssize_t n = a[0].b.len / 8;
    for (int i = 1; i < 6; i++) {
        if (get(args[i], &a[i], 0, sizes[i], i == 2 ? n * st->fb : n, names[i]) < 0) {
            release(a, 6);
            return NULL;
        }
    }
    const int64_t *lanes = a[0].b.buf, *actions = a[1].b.buf;
    const uint8_t *frames = a[2].b.buf, *term = a[4].b.buf, *trunc = a[5].b.buf;
    const double *rewards = a[3].b.buf;
    int64_t *w_next = st->b[S_NEXT].buf, *w_cur = st->b[S_CUR].buf, *w_ep = st->b[S_EP].buf;
    int64_t *w_off = st->b[S_OFF].buf, *safe = st->b[S_SAFE].buf;
    const int64_t *w_block = st->b[S_BLOCK].buf;
    uint8_t *m_frames = st->b[S_FRAMES].buf, *m_flags = st->b[S_FLAGS].buf;
    int32_t *m_epstep = st->b[S_EPSTEP].buf, *m_action = st->b[S_ACTION].buf;
    float *m_reward = st->b[S_REWARD].buf;
    int64_t *m_fill = st->b[S_FILL].buf;
    const Py_ssize_t h = st->h, bs = st->bs, fb = st->fb, nlanes = st->nlanes;
    if (lock_ring(st) < 0) {
        release(a, 6);
        return NULL;
    }
    if (*safe <= 0 || !may_write(st, n))
        goto decline;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t l = lanes[j];
        if (l < 0 || l >= nlanes || term[j] || trunc[j] || w_cur[l] < 0 || w_off[l] < h - 1
            || w_block[l] < 0 || w_next[l] >= (w_block[l] + 1) * bs || w_next[l] >= st->nslots
            || w_cur[l] >= st->nslots || !(fabs(rewards[j]) <= FLT_MAX)
            || actions[j] < INT32_MIN || actions[j] > INT32_MAX)
            goto decline;
    }
    if (st->published) {      /* before any store: a failure changes no table */
        for (Py_ssize_t j = 0; j < n; j++) {
            if (publish(st, w_cur[lanes[j]]) < 0) {
                release(a, 6);
                return unlock_ring(st, NULL);
            }
        }
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t l = lanes[j], slot = w_next[l], cur = w_cur[l];
        memcpy(m_frames + slot * fb, frames + j * fb, fb);
        m_epstep[slot] = (int32_t)(w_ep[l] + 1);
        m_flags[slot] = 0;
        m_fill[w_block[l]] += 1;
        m_action[cur] = (int32_t)actions[j];
        m_reward[cur] = (float)rewards[j];
        m_flags[cur] = HAS_ACTION_VALID;
        w_next[l] = slot + 1;
        w_cur[l] = slot;
        w_ep[l] += 1;
        w_off[l] += 1;
    }
    ((int64_t *)st->counts.buf)[0] += n;
    ((int64_t *)st->counts.buf)[1] += n;
    *safe -= 1;
    release(a, 6);
    return unlock_ring(st, PyLong_FromSsize_t(n));
decline:
    release(a, 6);
    return unlock_ring(st, PyLong_FromLong(-1));
}

static PyMethodDef store_methods[] = {
    {"step", (PyCFunction)(void (*)(void))Store_step, METH_FASTCALL, store_step_doc},
    {"start", (PyCFunction)(void (*)(void))Store_start, METH_FASTCALL, store_start_doc},
    {"steps", (PyCFunction)(void (*)(void))Store_steps, METH_FASTCALL, store_steps_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "expreplay.storage._write_ext.Store",
    .tp_basicsize = sizeof(StoreObject),
    .tp_dealloc = (destructor)Store_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Store(ring_tables, writer_tables, frame_format, frame_shape, history_len, "
              "block_size): the ring's write binding for one writer's lanes.",
    .tp_methods = store_methods,
    .tp_init = (initproc)Store_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ locked_call: a critical
 * section whose lock no exception can leave held. In Python, an exception (a signal's
 * KeyboardInterrupt) can land between a `with` block's body and its exit, which CPython does
 * not promise to run then; here the release follows the call in C, whatever it raised. */

PyDoc_STRVAR(locked_call_doc,
"locked_call(lock, pending, guard, fn, *args) -> fn(*args), called holding lock\n\n"
"Takes `lock`, finishes the write journal of `guard` first when its flag `pending` (a 1-byte\n"
"buffer) is set (guard._finish()), calls fn(*args), and releases `lock` whatever happened.\n"
"An interrupted wait for the lock raises before anything is called.");

static PyObject *locked_call(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    (void)mod;
    if (nargs < 4) {
        PyErr_SetString(PyExc_TypeError, "locked_call(lock, pending, guard, fn, *args)");
        return NULL;
    }
    PyObject *lock = args[0], *guard = args[2], *fn = args[3];
    Py_buffer flag;
    if (PyObject_GetBuffer(args[1], &flag, PyBUF_SIMPLE) < 0)
        return NULL;
    if (flag.len < 1) {
        PyBuffer_Release(&flag);
        PyErr_SetString(PyExc_ValueError, "locked_call: pending is a 1-byte buffer");
        return NULL;
    }
    PyObject *r = PyObject_CallMethodNoArgs(lock, str_acquire);
    if (!r) {
        PyBuffer_Release(&flag);
        return NULL;
    }
    Py_DECREF(r);
    PyObject *result = NULL;
    int pending = ((const uint8_t *)flag.buf)[0] != 0;
    PyBuffer_Release(&flag);
    if (pending) {
        r = PyObject_CallMethodNoArgs(guard, str_finish);
        if (r)
            Py_DECREF(r);
    }
    if (!pending || r)
        result = PyObject_Vectorcall(fn, args + 4, (size_t)(nargs - 4), NULL);
    return release_after(NULL, lock, result);
}

static PyMethodDef module_methods[] = {
    {"locked_call", (PyCFunction)(void (*)(void))locked_call, METH_FASTCALL, locked_call_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_write_ext", NULL, -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__write_ext(void)
{
    if (PyType_Ready(&StoreType) < 0)
        return NULL;
    str_acquire = PyUnicode_InternFromString("acquire");
    str_release = PyUnicode_InternFromString("release");
    str_finish = PyUnicode_InternFromString("_finish");
    if (!str_acquire || !str_release || !str_finish)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&StoreType);
    if (PyModule_AddObject(m, "Store", (PyObject *)&StoreType) < 0) {
        Py_DECREF(&StoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
