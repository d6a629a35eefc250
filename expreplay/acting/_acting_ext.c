/* Optional accelerator: the per-step bookkeeping of an acting group (expreplay/acting/), in one
 * call each.
 *
 * Why C: an acting step of a few lanes (one single env inline, a group of four) costs ~80
 * numpy calls of ~1 microsecond each, whatever the batch size; tensorpack's original runner
 * spends ~40 microseconds per step in all. These functions do the common case of each part:
 * the epsilon-greedy draws (draw_actions), the greedy actions (greedy_actions), the rows of the
 * lanes' states in their frame histories (history_rows), and, once the ring's write kernel has
 * stored a step of the lanes (expreplay/storage/_write_ext.c), the lanes' own bookkeeping:
 * frames pushed into their histories, scores, lengths and lives (lives_kept, push_steps).
 * Each declines (returns -1, having changed nothing) what it does not handle; the numpy path
 * (policy.py, envs/frames.py, lanes.py) then runs, which is the reference they are tested
 * against. It writes no table of the memory.
 *
 * Plain CPython C API + buffer protocol (no numpy headers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>


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

/* lives_kept(lanes, lives, lives_now) -> 1 when no lane of the step loses a life (lives[j] below
 * the lane's lives_now, both known: >= 0), else 0. int64 arrays. */
static PyObject *lives_kept(PyObject *self, PyObject *args)
{
    PyObject *o[3];
    if (!PyArg_ParseTuple(args, "OOO", &o[0], &o[1], &o[2]))
        return NULL;
    Buf b[3];
    memset(b, 0, sizeof(b));
    static const char *names[3] = {"lanes", "lives", "lives_now"};
    for (int i = 0; i < 3; i++) {
        if (get(o[i], &b[i], 0, 8, 0, names[i]) < 0) {
            release(b, 3);
            return NULL;
        }
    }
    Py_ssize_t n = b[0].b.len / 8, nlanes = b[2].b.len / 8;
    const int64_t *lanes = b[0].b.buf, *lives = b[1].b.buf, *now = b[2].b.buf;
    long kept = b[1].b.len / 8 >= n;
    for (Py_ssize_t j = 0; kept && j < n; j++) {
        int64_t l = lanes[j];
        if (l < 0 || l >= nlanes || (lives[j] >= 0 && now[l] >= 0 && lives[j] < now[l]))
            kept = 0;
    }
    release(b, 3);
    return PyLong_FromLong(kept);
}

/* push_steps(lanes, frames, rewards, lives, h_frames, h_pos, h_base, history_len, scores,
 * lengths, lives_now) -> 0: the lanes' bookkeeping after a stored step none of which ended an
 * episode or lost a life: each frame (raw bytes, one per lane) pushed into the lane's
 * FrameHistory ring (h_frames rows base[l] .. base[l] + history_len - 1, pos[l] the newest:
 * expreplay/acting/envs/frames.py), the reward added to its score, its length + 1, and, when
 * the step reports lives (some >= 0), the lives stored. -1 (nothing changed) when a table does
 * not fit (the caller's numpy path then runs). */
static PyObject *push_steps(PyObject *self, PyObject *args)
{
    PyObject *o[10];
    Py_ssize_t h;
    if (!PyArg_ParseTuple(args, "OOOOOOOnOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &h, &o[7], &o[8], &o[9]))
        return NULL;
    Buf b[10];
    memset(b, 0, sizeof(b));
    const int writable[10] = {0, 0, 0, 0, 1, 1, 0, 1, 1, 1};
    const Py_ssize_t sizes[10] = {8, 1, 8, 8, 1, 8, 8, 8, 8, 8};
    static const char *names[10] = {"lanes", "frames", "rewards", "lives", "h_frames", "h_pos",
                                    "h_base", "scores", "lengths", "lives_now"};
    for (int i = 0; i < 10; i++) {
        if (get(o[i], &b[i], writable[i], sizes[i], 0, names[i]) < 0) {
            release(b, 10);
            return NULL;
        }
    }
    Py_ssize_t n = b[0].b.len / 8, nlanes = b[5].b.len / 8;
    Py_ssize_t fb = (n && h > 0) ? b[1].b.len / n : 0;
    long status = 0;
    if (h < 1 || b[2].b.len < 8 * n || b[3].b.len < 8 * n || b[6].b.len != 8 * nlanes
        || b[7].b.len != 8 * nlanes || b[8].b.len != 8 * nlanes || b[9].b.len != 8 * nlanes
        || (n && (fb < 1 || b[4].b.len != nlanes * h * fb)))
        status = -1;
    const int64_t *lanes = b[0].b.buf, *lives = b[3].b.buf, *base = b[6].b.buf;
    const uint8_t *frames = b[1].b.buf;
    const double *rewards = b[2].b.buf;
    uint8_t *h_frames = b[4].b.buf;
    int64_t *pos = b[5].b.buf, *length = b[8].b.buf, *now = b[9].b.buf;
    double *score = b[7].b.buf;
    int any_lives = 0;
    for (Py_ssize_t j = 0; status == 0 && j < n; j++) {
        int64_t l = lanes[j];
        if (l < 0 || l >= nlanes || base[l] < 0 || base[l] + h > nlanes * h)
            status = -1;
        else
            any_lives |= lives[j] >= 0;
    }
    for (Py_ssize_t j = 0; status == 0 && j < n; j++) {
        int64_t l = lanes[j];
        int64_t p = (pos[l] + 1) % h;
        pos[l] = p;
        memcpy(h_frames + (base[l] + p) * fb, frames + j * fb, fb);
        score[l] += rewards[j];
        length[l] += 1;
        if (any_lives)     /* as the numpy path: the batch's lives replace the lanes' */
            now[l] = lives[j];
    }
    release(b, 10);
    return PyLong_FromLong(status);
}

static PyMethodDef methods[] = {
    {"greedy_actions", greedy_actions, METH_VARARGS,
     "actions[greedy[i]] = argmax(q[i]) without releasing the GIL; -1 non-finite, -2 not handled."},
    {"history_rows", history_rows, METH_VARARGS,
     "The FrameHistory rows of the lanes' states, oldest frame first."},
    {"draw_actions", draw_actions, METH_VARARGS,
     "Epsilon-greedy draws of a batch of lanes from pre-drawn uniforms; -1: refill first."},
    {"lives_kept", lives_kept, METH_VARARGS,
     "1 when no lane of the step loses a life, else 0."},
    {"push_steps", push_steps, METH_VARARGS,
     "A stored step's frames, rewards and lives into the lanes' histories and counters."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_acting_ext", NULL, -1, methods};

PyMODINIT_FUNC PyInit__acting_ext(void)
{
    return PyModule_Create(&module);
}
