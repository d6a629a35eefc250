/* Optional accelerator: the common case of storing one acting step of a batch of lanes.
 *
 * Why C: an acting step of a few lanes (one single env inline, a group of four) costs ~80
 * numpy calls of ~1 microsecond each in expreplay/storage/memory.py and expreplay/acting/group.py, whatever
 * the batch size; tensorpack's original runner spends ~40 microseconds per step in all. This
 * kernel (Store, bound once to a writer's tables) does the whole common case in one call: for
 * every lane, copy the frame into the memory's next slot, publish the step taken from the
 * lane's current slot (VALID), advance the writer, push the frame into the lane's history
 * ring, add the reward to its score; and a single lane's LaneWriter.add_step, its arguments'
 * checks included, in another.
 *
 * It handles only the common case and changes nothing (returns -1) when any lane needs more:
 * its block is full, its current slot lies near a block start (history may reach into the
 * previous block: I3/I5 of memory.py), its episode ends, it loses a life, or a reward is not
 * a finite float32. Then the numpy path (BatchWriter.add_steps and ActingGroup._store) runs,
 * which handles everything and is the reference this kernel is tested against.
 *
 * The caller holds the memory's lock. Plain CPython C API + buffer protocol (no numpy headers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define HAS_ACTION_VALID 9   /* memory.py: _HAS_ACTION | _VALID */

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
        PyErr_Format(PyExc_ValueError, "store_steps: %s is too small", name);
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

/* draw_actions(lanes, uniforms, cursor, draws, exploration, open, num_actions, actions, greedy)
 * -> g, the number of greedy rows written to greedy[0:g]; or -1 (nothing done) when some lane
 * has used up its pre-drawn uniforms (the caller refills them from the runners' RNGs).
 * uniforms: float64 (num_lanes, draws, 2) (explore?, action) per lane, read at cursor (int64
 * per lane, advanced); exploration: float64, one per row or one for all; open: bool per lane
 * (a lane outside an episode acts at random: its action is ignored); actions, greedy: int64
 * outputs of len(lanes). */
static PyObject *draw_actions(PyObject *self, PyObject *args)
{
    PyObject *o[9];
    Py_ssize_t draws, num_actions;
    if (!PyArg_ParseTuple(args, "OOOnOOnOO", &o[0], &o[1], &o[2], &draws, &o[3], &o[4],
                          &num_actions, &o[5], &o[6]))
        return NULL;
    Buf b[7];
    memset(b, 0, sizeof(b));
    const int writable[7] = {0, 0, 1, 0, 0, 1, 1};
    const Py_ssize_t sizes[7] = {8, 8, 8, 8, 1, 8, 8};
    static const char *names[7] = {"lanes", "uniforms", "cursor", "exploration", "open",
                                   "actions", "greedy"};
    for (int i = 0; i < 7; i++) {
        if (get(o[i], &b[i], writable[i], sizes[i], 0, names[i]) < 0) {
            release(b, 7);
            return NULL;
        }
    }
    Py_ssize_t n = b[0].b.len / 8, nlanes = b[2].b.len / 8, neps = b[3].b.len / 8;
    if (b[1].b.len < nlanes * draws * 2 * 8 || b[4].b.len < nlanes || (neps != 1 && neps != n)
        || b[5].b.len < n * 8 || b[6].b.len < n * 8 || num_actions < 1) {
        release(b, 7);
        PyErr_SetString(PyExc_ValueError, "draw_actions: inconsistent array sizes");
        return NULL;
    }
    const int64_t *lanes = b[0].b.buf;
    const double *u = b[1].b.buf, *eps = b[3].b.buf;
    int64_t *cursor = b[2].b.buf, *actions = b[5].b.buf, *greedy = b[6].b.buf;
    const uint8_t *open = b[4].b.buf;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (lanes[j] < 0 || lanes[j] >= nlanes || cursor[lanes[j]] >= draws || cursor[lanes[j]] < 0) {
            release(b, 7);
            return PyLong_FromLong(-1);
        }
    }
    Py_ssize_t g = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t l = lanes[j];
        const double *d = u + (l * draws + cursor[l]) * 2;
        cursor[l] += 1;
        int64_t a = (int64_t)(d[1] * (double)num_actions);
        actions[j] = a < num_actions ? a : num_actions - 1;
        if (d[0] >= eps[neps == 1 ? 0 : j] && open[l])
            greedy[g++] = j;
    }
    release(b, 7);
    return PyLong_FromSsize_t(g);
}


/* greedy_actions(q, greedy, actions) -> 0: actions[greedy[i]] = argmax(q[i]) for the rows of
 * the (len(greedy), A) float32 or float64 C-contiguous Q-values, A = the actions' range; or,
 * having changed nothing: -1 when a Q-value is NaN or infinite, -2 when q is not such an array
 * (the caller's checks then say what is wrong). numpy's argmax would do the same but release
 * the GIL, which a simulator thread then waits to win back. */
static PyObject *greedy_actions(PyObject *self, PyObject *args)
{
    PyObject *qo, *go, *ao;
    Py_ssize_t num_actions;
    if (!PyArg_ParseTuple(args, "OOOn", &qo, &go, &ao, &num_actions))
        return NULL;
    if (!PyObject_CheckBuffer(qo))
        return PyLong_FromLong(-2);
    Py_buffer q, g, a;
    if (PyObject_GetBuffer(qo, &q, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0) {
        PyErr_Clear();                  /* e.g. a strided view: the caller's numpy path */
        return PyLong_FromLong(-2);
    }
    if (PyObject_GetBuffer(go, &g, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&q);
        return NULL;
    }
    if (PyObject_GetBuffer(ao, &a, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&q);
        PyBuffer_Release(&g);
        return NULL;
    }
    PyObject *result = NULL;
    long status = 0;
    Py_ssize_t rows = g.len / 8, na = a.len / 8;
    const char *fmt = q.format ? q.format : "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<') fmt++;
    int is_f = strcmp(fmt, "f") == 0, is_d = strcmp(fmt, "d") == 0;
    if (q.ndim != 2 || q.shape[0] != rows || q.shape[1] != num_actions || num_actions < 1
        || !(is_f || is_d)) {
        status = -2;
        goto done;
    }
    const Py_ssize_t A = num_actions, total = rows * A;
    if (is_f) {
        for (Py_ssize_t i = 0; i < total; i++)
            if (!isfinite(((const float *)q.buf)[i])) { status = -1; goto done; }
    } else {
        for (Py_ssize_t i = 0; i < total; i++)
            if (!isfinite(((const double *)q.buf)[i])) { status = -1; goto done; }
    }
    const int64_t *gi = g.buf;
    int64_t *act = a.buf;
    for (Py_ssize_t i = 0; i < rows; i++)
        if (gi[i] < 0 || gi[i] >= na) {
            PyErr_SetString(PyExc_IndexError, "greedy_actions: row out of range");
            goto done;
        }
    for (Py_ssize_t i = 0; i < rows; i++) {
        Py_ssize_t best = 0;
        if (is_f) {
            const float *r = (const float *)q.buf + i * A;
            for (Py_ssize_t k = 1; k < A; k++) if (r[k] > r[best]) best = k;
        } else {
            const double *r = (const double *)q.buf + i * A;
            for (Py_ssize_t k = 1; k < A; k++) if (r[k] > r[best]) best = k;
        }
        act[gi[i]] = best;
    }
done:
    if (!PyErr_Occurred())
        result = PyLong_FromLong(status);
    PyBuffer_Release(&q);
    PyBuffer_Release(&g);
    PyBuffer_Release(&a);
    return result;
}


/* history_rows(lanes, pos, base, history_len, rows): rows[j, k] = the FrameHistory row of
 * lane lanes[j]'s k-th frame, oldest first: base[l] + (pos[l] + 1 + k) % history_len (the ring
 * invariant of expreplay/acting/envs/frames.py). int64 arrays; rows (at least len(lanes) * history_len).
 * What five numpy calls on a few lanes cost ~5 microseconds for. */
static PyObject *history_rows(PyObject *self, PyObject *args)
{
    PyObject *o[4];
    Py_ssize_t h;
    if (!PyArg_ParseTuple(args, "OOOnO", &o[0], &o[1], &o[2], &h, &o[3]))
        return NULL;
    Buf b[4];
    memset(b, 0, sizeof(b));
    const int writable[4] = {0, 0, 0, 1};
    static const char *names[4] = {"lanes", "pos", "base", "rows"};
    for (int i = 0; i < 4; i++) {
        if (get(o[i], &b[i], writable[i], 8, 0, names[i]) < 0) {
            release(b, 4);
            return NULL;
        }
    }
    Py_ssize_t n = b[0].b.len / 8, nlanes = b[1].b.len / 8;
    if (h < 1 || b[2].b.len / 8 != nlanes || b[3].b.len / 8 < n * h) {
        release(b, 4);
        PyErr_SetString(PyExc_ValueError, "history_rows: inconsistent array sizes");
        return NULL;
    }
    const int64_t *lanes = b[0].b.buf, *pos = b[1].b.buf, *base = b[2].b.buf;
    int64_t *rows = b[3].b.buf;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t l = lanes[j];
        if (l < 0 || l >= nlanes) {
            release(b, 4);
            PyErr_SetString(PyExc_IndexError, "history_rows: lane out of range");
            return NULL;
        }
        for (Py_ssize_t k = 0; k < h; k++)
            rows[j * h + k] = base[l] + (pos[l] + 1 + k) % h;
    }
    release(b, 4);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ Store: the write binding
 *
 * A writer's binding to the tables it writes: the memory's (frames, epstep, flags, action,
 * reward, block_fill), the writer's per-lane state (next slot, current slot, its epstep and
 * block offset, the active block, and `safe`, the calls left before some lane may need a new
 * block: expreplay/storage/writers.py), and optionally an acting group's per-lane companions (the
 * FrameHistory ring, scores, lengths, lives). Built once per writer (and history), so that a
 * step is one call with the step's values only. Like store_steps it does the common case only
 * and returns -1, having changed nothing, when anything needs the numpy path. The caller holds
 * the memory's lock. */

enum { S_FRAMES, S_EPSTEP, S_FLAGS, S_ACTION, S_REWARD, S_FILL, S_GEN, S_STATE, S_INTACT,
       S_NEXT, S_CUR, S_EP, S_OFF, S_BLOCK, S_SAFE, S_CURGEN,
       S_HFRAMES, S_HPOS, S_HBASE, S_SCORE, S_LENGTH, S_LIVES, S_NBUF };
#define N_MEM_TABLES 9
#define N_WRITER_TABLES 7
#define BLOCK_FREE 0   /* memory.py: _FREE */

typedef struct {
    PyObject_HEAD
    Py_buffer b[S_NBUF];
    int ok[S_NBUF];
    int has_history;
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
    Py_TYPE(st)->tp_free((PyObject *)st);
}

static int Store_init(StoreObject *st, PyObject *args, PyObject *kw)
{
    PyObject *mem, *wri, *hist, *shape;
    const char *format;
    (void)kw;
    if (st->ok[0]) {
        PyErr_SetString(PyExc_TypeError, "Store is initialised once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O!O!OsO!nn:Store", &PyTuple_Type, &mem, &PyTuple_Type, &wri, &hist,
                          &format, &PyTuple_Type, &shape, &st->h, &st->bs))
        return -1;
    st->has_history = hist != Py_None;
    if (PyTuple_GET_SIZE(mem) != N_MEM_TABLES || PyTuple_GET_SIZE(wri) != N_WRITER_TABLES
        || (st->has_history && (!PyTuple_Check(hist) || PyTuple_GET_SIZE(hist) != 6))) {
        PyErr_SetString(PyExc_ValueError, "Store: 9 memory tables, 7 writer tables, 6 history tables or None");
        return -1;
    }
    static const Py_ssize_t item[S_NBUF] = {1, 4, 1, 4, 4, 8, 8, 1, 1, 8, 8, 8, 8, 8, 8, 8,
                                            1, 8, 8, 8, 8, 8};
    for (int i = 0; i < S_NBUF; i++) {
        if (i >= S_HFRAMES && !st->has_history)
            break;
        PyObject *o = i < S_NEXT ? PyTuple_GET_ITEM(mem, i)
                    : i < S_HFRAMES ? PyTuple_GET_ITEM(wri, i - S_NEXT) : PyTuple_GET_ITEM(hist, i - S_HFRAMES);
        int writable = i != S_BLOCK && i != S_HBASE && i != S_GEN && i != S_STATE && i != S_INTACT;
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
    if (st->has_history) {
        bad |= st->b[S_HFRAMES].len != st->nlanes * st->h * st->fb;
        for (int i = S_HPOS; i <= S_LIVES; i++)
            bad |= st->b[i].len != 8 * st->nlanes;
    }
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
    if (!exact_frame(st, args[2], &view))
        return PyLong_FromLong(-1);
    uint8_t *flags = st->b[S_FLAGS].buf;
    memcpy((uint8_t *)st->b[S_FRAMES].buf + slot * st->fb, view.buf, st->fb);
    PyBuffer_Release(&view);
    ((int32_t *)st->b[S_EPSTEP].buf)[slot] = (int32_t)(ep[0] + 1);
    flags[slot] = 0;
    ((int64_t *)st->b[S_FILL].buf)[block[0]] += 1;
    ((int32_t *)st->b[S_ACTION].buf)[from] = (int32_t)action;
    ((float *)st->b[S_REWARD].buf)[from] = (float)reward;
    flags[from] = HAS_ACTION_VALID | ends;   /* TERMINATED 2, TRUNCATED 4: ring.py's _slots */
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
    int64_t *next = st->b[S_NEXT].buf, *cur = st->b[S_CUR].buf, *ep = st->b[S_EP].buf;
    int64_t *off = st->b[S_OFF].buf, *safe = st->b[S_SAFE].buf;
    const int64_t *block = st->b[S_BLOCK].buf;
    int64_t slot = next[0], bs = st->bs;
    if (*safe <= 0 || block[0] < 0 || block[0] >= st->nblocks || slot < block[0] * bs
        || slot >= (block[0] + 1) * bs)
        return PyLong_FromLong(-1);
    Py_buffer view;
    if (!exact_frame(st, args[0], &view))
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
"steps(lanes, actions, frames, rewards, terminated, truncated, lives) -> n, or -1\n\n"
"An acting step of the lanes (int64 lanes, actions, lives; float64 rewards; bool ends; the\n"
"frames' raw bytes, one frame per lane) stored and pushed into the bound history, scores,\n"
"lengths and lives, common case only (as store_steps): -1, having changed nothing, otherwise.");

static PyObject *Store_steps(StoreObject *st, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "steps takes 7 arguments");
        return NULL;
    }
    if (!st->has_history) {
        PyErr_SetString(PyExc_TypeError, "steps: this Store has no history bound");
        return NULL;
    }
    Buf a[7];
    memset(a, 0, sizeof(a));
    static const Py_ssize_t sizes[7] = {8, 8, 1, 8, 1, 1, 8};
    static const char *names[7] = {"lanes", "actions", "frames", "rewards", "terminated",
                                   "truncated", "lives"};
    if (get(args[0], &a[0], 0, 8, 0, "lanes") < 0) { release(a, 7); return NULL; }
    Py_ssize_t n = a[0].b.len / 8;
    for (int i = 1; i < 7; i++) {
        if (get(args[i], &a[i], 0, sizes[i], i == 2 ? n * st->fb : n, names[i]) < 0) {
            release(a, 7);
            return NULL;
        }
    }
    const int64_t *lanes = a[0].b.buf, *actions = a[1].b.buf, *lives = a[6].b.buf;
    const uint8_t *frames = a[2].b.buf, *term = a[4].b.buf, *trunc = a[5].b.buf;
    const double *rewards = a[3].b.buf;
    int64_t *w_next = st->b[S_NEXT].buf, *w_cur = st->b[S_CUR].buf, *w_ep = st->b[S_EP].buf;
    int64_t *w_off = st->b[S_OFF].buf, *safe = st->b[S_SAFE].buf;
    const int64_t *w_block = st->b[S_BLOCK].buf;
    uint8_t *m_frames = st->b[S_FRAMES].buf, *m_flags = st->b[S_FLAGS].buf;
    int32_t *m_epstep = st->b[S_EPSTEP].buf, *m_action = st->b[S_ACTION].buf;
    float *m_reward = st->b[S_REWARD].buf;
    int64_t *m_fill = st->b[S_FILL].buf;
    uint8_t *h_frames = st->b[S_HFRAMES].buf;
    int64_t *h_pos = st->b[S_HPOS].buf;
    const int64_t *h_base = st->b[S_HBASE].buf;
    double *g_score = st->b[S_SCORE].buf;
    int64_t *g_length = st->b[S_LENGTH].buf, *g_lives = st->b[S_LIVES].buf;
    const Py_ssize_t h = st->h, bs = st->bs, fb = st->fb, nlanes = st->nlanes;
    int any_lives = 0;
    if (*safe <= 0)
        goto decline;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t l = lanes[j];
        if (l < 0 || l >= nlanes || term[j] || trunc[j] || w_cur[l] < 0 || w_off[l] < h - 1
            || w_block[l] < 0 || w_next[l] >= (w_block[l] + 1) * bs || w_next[l] >= st->nslots
            || w_cur[l] >= st->nslots || !(fabs(rewards[j]) <= FLT_MAX)
            || actions[j] < INT32_MIN || actions[j] > INT32_MAX
            || h_base[l] < 0 || h_base[l] + h > nlanes * h
            || (lives[j] >= 0 && g_lives[l] >= 0 && lives[j] < g_lives[l]))
            goto decline;
        any_lives |= lives[j] >= 0;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t l = lanes[j], slot = w_next[l], cur = w_cur[l];
        const uint8_t *frame = frames + j * fb;
        memcpy(m_frames + slot * fb, frame, fb);
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
        int64_t pos = (h_pos[l] + 1) % h;
        h_pos[l] = pos;
        memcpy(h_frames + (h_base[l] + pos) * fb, frame, fb);
        g_score[l] += rewards[j];
        g_length[l] += 1;
        if (any_lives)     /* as the numpy path: the batch's lives replace the lanes' */
            g_lives[l] = lives[j];
    }
    *safe -= 1;
    release(a, 7);
    return PyLong_FromSsize_t(n);
decline:
    release(a, 7);
    return PyLong_FromLong(-1);
}

static PyMethodDef store_methods[] = {
    {"step", (PyCFunction)(void (*)(void))Store_step, METH_FASTCALL, store_step_doc},
    {"start", (PyCFunction)(void (*)(void))Store_start, METH_FASTCALL, store_start_doc},
    {"steps", (PyCFunction)(void (*)(void))Store_steps, METH_FASTCALL, store_steps_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "expreplay.storage._acting_ext.Store",
    .tp_basicsize = sizeof(StoreObject),
    .tp_dealloc = (destructor)Store_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Store(memory_tables, writer_tables, history_tables or None, frame_format, "
              "frame_shape, history_len, block_size): a writer's binding to the tables it writes.",
    .tp_methods = store_methods,
    .tp_init = (initproc)Store_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"greedy_actions", greedy_actions, METH_VARARGS,
     "actions[greedy[i]] = argmax(q[i]) without releasing the GIL; -1 non-finite, -2 not handled."},
    {"history_rows", history_rows, METH_VARARGS,
     "The FrameHistory rows of the lanes' states, oldest frame first."},
    {"draw_actions", draw_actions, METH_VARARGS,
     "Epsilon-greedy draws of a batch of lanes from pre-drawn uniforms; -1: refill first."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_acting_ext", NULL, -1, methods};

PyMODINIT_FUNC PyInit__acting_ext(void)
{
    if (PyType_Ready(&StoreType) < 0)
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
