/* Optional accelerator: the common case of storing one acting step of a batch of lanes.
 *
 * Why C: an acting step of a few lanes (one single env inline, a group of four) costs ~80
 * numpy calls of ~1 microsecond each in expreplay/memory.py and expreplay/acting.py, whatever
 * the batch size; tensorpack's original runner spends ~40 microseconds per step in all. This
 * kernel does the whole common case in one call: for every lane, copy the frame into the
 * memory's next slot, publish the step taken from the lane's current slot (VALID), advance
 * the writer, push the frame into the lane's history ring, add the reward to its score.
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

enum { LANES, ACTIONS, FRAMES, REWARDS, TERM, TRUNC, LIVES,
       W_NEXT, W_CUR, W_EPSTEP, W_OFF, W_BLOCK,
       M_FRAMES, M_EPSTEP, M_FLAGS, M_ACTION, M_REWARD, M_FILL,
       H_FRAMES, H_POS, H_BASE, G_SCORE, G_LENGTH, G_LIVES, NBUF };

/* store_steps(lanes, actions, frames, rewards, terminated, truncated, lives,
 *             w_next, w_cur_slot, w_cur_epstep, w_cur_off, w_block,
 *             m_frames, m_epstep, m_flags, m_action, m_reward, m_block_fill,
 *             h_frames, h_pos, h_base, g_score, g_length, g_lives,
 *             frame_bytes, history_len, block_size, num_slots, num_blocks, num_lanes)
 * -> n (steps stored) or -1 (nothing done: not the common case).
 * Types: lanes, actions, lives, the w_ arrays, m_block_fill, h_pos, h_base, g_length, g_lives int64,
 * rewards/g_score float64, terminated/truncated bool, m_epstep/m_action int32, m_flags uint8,
 * m_reward float32, frames/m_frames/h_frames raw frame bytes. */
static PyObject *store_steps(PyObject *self, PyObject *args)
{
    PyObject *o[NBUF];
    Py_ssize_t fb, h, bs, nslots, nblocks, nlanes;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOOOOOOOOOOnnnnnn",
                          &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9],
                          &o[10], &o[11], &o[12], &o[13], &o[14], &o[15], &o[16], &o[17], &o[18],
                          &o[19], &o[20], &o[21], &o[22], &o[23],
                          &fb, &h, &bs, &nslots, &nblocks, &nlanes))
        return NULL;
    Buf b[NBUF];
    memset(b, 0, sizeof(b));
    const int writable[NBUF] = {0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1};
    if (get(o[LANES], &b[LANES], 0, 8, 0, "lanes") < 0) { release(b, NBUF); return NULL; }
    Py_ssize_t n = b[LANES].b.len / 8;
    const Py_ssize_t sizes[NBUF] = {8, 8, 1, 8, 1, 1, 8, 8, 8, 8, 8, 8, 1, 4, 1, 4, 4, 8, 1, 8, 8, 8, 8, 8};
    const Py_ssize_t counts[NBUF] = {n, n, n * fb, n, n, n, n, nlanes, nlanes, nlanes, nlanes, nlanes,
                                     (nslots + 1) * fb, nslots, nslots, nslots, nslots, nblocks,
                                     nlanes * h * fb, nlanes, nlanes, nlanes, nlanes, nlanes};
    static const char *names[NBUF] = {"lanes", "actions", "frames", "rewards", "terminated",
        "truncated", "lives", "w_next", "w_cur_slot", "w_cur_epstep", "w_cur_off", "w_block",
        "m_frames", "m_epstep", "m_flags", "m_action", "m_reward", "m_block_fill", "h_frames",
        "h_pos", "h_base", "g_score", "g_length", "g_lives"};
    for (int i = 1; i < NBUF; i++) {
        if (get(o[i], &b[i], writable[i], sizes[i], counts[i], names[i]) < 0) {
            release(b, NBUF);
            return NULL;
        }
    }
    const int64_t *lanes = b[LANES].b.buf, *actions = b[ACTIONS].b.buf, *lives = b[LIVES].b.buf;
    const uint8_t *frames = b[FRAMES].b.buf, *term = b[TERM].b.buf, *trunc = b[TRUNC].b.buf;
    const double *rewards = b[REWARDS].b.buf;
    int64_t *w_next = b[W_NEXT].b.buf, *w_cur = b[W_CUR].b.buf, *w_ep = b[W_EPSTEP].b.buf;
    int64_t *w_off = b[W_OFF].b.buf;
    const int64_t *w_block = b[W_BLOCK].b.buf;
    uint8_t *m_frames = b[M_FRAMES].b.buf, *m_flags = b[M_FLAGS].b.buf;
    int32_t *m_epstep = b[M_EPSTEP].b.buf, *m_action = b[M_ACTION].b.buf;
    float *m_reward = b[M_REWARD].b.buf;
    int64_t *m_fill = b[M_FILL].b.buf;
    uint8_t *h_frames = b[H_FRAMES].b.buf;
    int64_t *h_pos = b[H_POS].b.buf;
    const int64_t *h_base = b[H_BASE].b.buf;
    double *g_score = b[G_SCORE].b.buf;
    int64_t *g_length = b[G_LENGTH].b.buf, *g_lives = b[G_LIVES].b.buf;

    /* Every lane must be the common case, else nothing is changed. */
    int any_lives = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t l = lanes[j];
        if (l < 0 || l >= nlanes || term[j] || trunc[j] || w_cur[l] < 0 || w_off[l] < h - 1
            || w_block[l] < 0 || w_next[l] >= (w_block[l] + 1) * bs || w_next[l] >= nslots
            || w_cur[l] >= nslots || !(fabs(rewards[j]) <= FLT_MAX)
            || actions[j] < INT32_MIN || actions[j] > INT32_MAX
            || (lives[j] >= 0 && g_lives[l] >= 0 && lives[j] < g_lives[l])) {
            release(b, NBUF);
            return PyLong_FromLong(-1);
        }
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
    release(b, NBUF);
    return PyLong_FromSsize_t(n);
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
 * invariant of expreplay/envs.py). int64 arrays; rows (at least len(lanes) * history_len).
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

static PyMethodDef methods[] = {
    {"greedy_actions", greedy_actions, METH_VARARGS,
     "actions[greedy[i]] = argmax(q[i]) without releasing the GIL; -1 non-finite, -2 not handled."},
    {"history_rows", history_rows, METH_VARARGS,
     "The FrameHistory rows of the lanes' states, oldest frame first."},
    {"draw_actions", draw_actions, METH_VARARGS,
     "Epsilon-greedy draws of a batch of lanes from pre-drawn uniforms; -1: refill first."},
    {"store_steps", store_steps, METH_VARARGS,
     "Store one acting step of a batch of lanes, common case only; -1: nothing done."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_acting_ext", NULL, -1, methods};

PyMODINIT_FUNC PyInit__acting_ext(void) { return PyModule_Create(&module); }
