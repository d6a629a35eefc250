/* Optional accelerator for expreplay/storage/priority.py: the sum/min tree's descent and updates.
 *
 * Why C: a prioritized sample draws 64 leaves through `depth` levels of `fanout` children, and
 * an update of 64 priorities recomputes their ancestors. In numpy each level is a handful of
 * calls on (64, fanout) arrays (~30 us a level); here the whole batch is a few microseconds.
 *
 * The tree is SumMinTree's: `sums` and `mins` are tuples of C-contiguous float64 arrays, one per
 * level, level 0 the root, the last the leaves; node i of level l has children
 * i * fanout .. i * fanout + fanout - 1 of level l + 1. Every index read is checked.
 *
 * An inner node is always recomputed from its children alone, summed left to right, so the
 * tree is a function of its leaves: priority.py uses these functions for every update when
 * the module is built (and numpy for all of them when it is not), never a mix.
 *
 * Plain CPython C API + buffer protocol (no numpy headers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#define MAX_DEPTH 64

typedef struct {
    Py_buffer b[MAX_DEPTH + 1];
    int n;
} Levels;

static void release_levels(Levels *lv)
{
    for (int i = 0; i < lv->n; i++)
        PyBuffer_Release(&lv->b[i]);
    lv->n = 0;
}

static int get_levels(PyObject *tuple, Levels *lv, int writable, const char *name)
{
    lv->n = 0;
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) < 2 || PyTuple_GET_SIZE(tuple) > MAX_DEPTH + 1) {
        PyErr_Format(PyExc_ValueError, "%s must be a tuple of 2 to %d level arrays", name, MAX_DEPTH + 1);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(tuple, i), &lv->b[i], flags) < 0) {
            release_levels(lv);
            return -1;
        }
        lv->n++;
        const char *f = lv->b[i].format;
        if (*f == '@' || *f == '=' || *f == '<') f++;
        if (lv->b[i].itemsize != 8 || strcmp(f, "d") != 0) {
            PyErr_Format(PyExc_ValueError, "%s levels must be float64 arrays", name);
            release_levels(lv);
            return -1;
        }
    }
    return 0;
}

static int get_vector(PyObject *obj, Py_buffer *b, const char *fmt, int writable, const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, flags) < 0)
        return -1;
    const char *f = b->format;
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (b->ndim != 1 || b->itemsize != 8 || !strchr(fmt, f[0]) || f[1] != '\0') {
        PyErr_Format(PyExc_ValueError, "%s must be a 1-D %s array", name,
                     fmt[0] == 'd' ? "float64" : "int64");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

#define LEN(lv, i) ((lv)->b[i].len / 8)
#define DATA(lv, i) ((double *)(lv)->b[i].buf)

PyDoc_STRVAR(find_doc,
"find(sums, u, out, fanout)\n\n"
"For each prefix sum u[i], the leaf where it falls (SumMinTree.find): out[i] = the leaf whose\n"
"running-sum interval [sum(leaves before it), + its value) holds u[i], descending from the\n"
"root one level at a time; at each level the last child is taken when u is beyond the others.");

static PyObject *find(PyObject *self, PyObject *args)
{
    PyObject *sums_obj, *u_obj, *out_obj;
    Py_ssize_t k;
    Levels lv;
    Py_buffer ub, ob;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOn:find", &sums_obj, &u_obj, &out_obj, &k))
        return NULL;
    if (k < 2) {
        PyErr_SetString(PyExc_ValueError, "fanout must be >= 2");
        return NULL;
    }
    if (get_levels(sums_obj, &lv, 0, "sums") < 0)
        return NULL;
    if (get_vector(u_obj, &ub, "d", 0, "u") < 0) {
        release_levels(&lv);
        return NULL;
    }
    if (get_vector(out_obj, &ob, "lqn", 1, "out") < 0) {
        PyBuffer_Release(&ub);
        release_levels(&lv);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = ub.len / 8;
    if (ob.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "out must have the length of u");
        goto done;
    }
    const double *u = ub.buf;
    int64_t *out = ob.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        double left = u[i];
        Py_ssize_t node = 0;
        for (int level = 1; level < lv.n; level++) {
            Py_ssize_t base = node * k;
            if (base + k > LEN(&lv, level)) {
                PyErr_SetString(PyExc_ValueError, "sums: a level is too short for its parents");
                goto done;
            }
            const double *c = DATA(&lv, level) + base;
            double acc = 0.0;
            Py_ssize_t j = 0;
            for (; j < k - 1; j++) {
                if (acc + c[j] > left)
                    break;
                acc += c[j];
            }
            left -= acc;
            node = base + j;
        }
        out[i] = node;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&ob);
    PyBuffer_Release(&ub);
    release_levels(&lv);
    return result;
}

/* Recompute node `node` of level `level` (< depth) from its children. */
static inline int recompute(Levels *s, Levels *m, int level, Py_ssize_t node, Py_ssize_t k)
{
    Py_ssize_t base = node * k;
    if (node >= LEN(s, level) || base + k > LEN(s, level + 1))
        return -1;
    const double *cs = DATA(s, level + 1) + base, *cm = DATA(m, level + 1) + base;
    double sum = 0.0, mn = cm[0];
    for (Py_ssize_t j = 0; j < k; j++) {
        sum += cs[j];
        if (cm[j] < mn)
            mn = cm[j];
    }
    DATA(s, level)[node] = sum;
    DATA(m, level)[node] = mn;
    return 0;
}

/* Both trees' levels, writable, checked to have the same shape; on failure nothing is held. */
static int get_tree(PyObject *sums_obj, PyObject *mins_obj, Levels *s, Levels *m)
{
    if (get_levels(sums_obj, s, 1, "sums") < 0)
        return -1;
    if (get_levels(mins_obj, m, 1, "mins") < 0) {
        release_levels(s);
        return -1;
    }
    int same = s->n == m->n;
    for (int i = 0; same && i < s->n; i++)
        same = LEN(s, i) == LEN(m, i);
    if (!same) {
        PyErr_SetString(PyExc_ValueError, "sums and mins must have the same levels");
        release_levels(m);
        release_levels(s);
        return -1;
    }
    return 0;
}

/* Recompute the ancestors of one leaf from their children, bottom up. */
static int refresh_leaf(Levels *s, Levels *m, Py_ssize_t node, Py_ssize_t k)
{
    for (Py_ssize_t level = s->n - 2; level >= 0; level--) {
        node /= k;
        if (recompute(s, m, (int)level, node, k) < 0) {
            PyErr_SetString(PyExc_ValueError, "a level is too short for its parents");
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(refresh_doc,
"refresh(sums, mins, leaves, fanout)\n\n"
"Recompute every ancestor of the given leaf indices (int64) from its children, bottom up.");

static PyObject *refresh(PyObject *self, PyObject *args)
{
    PyObject *sums_obj, *mins_obj, *leaves_obj;
    Py_ssize_t k;
    Levels s, m;
    Py_buffer lb;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOn:refresh", &sums_obj, &mins_obj, &leaves_obj, &k))
        return NULL;
    if (k < 2) {
        PyErr_SetString(PyExc_ValueError, "fanout must be >= 2");
        return NULL;
    }
    if (get_tree(sums_obj, mins_obj, &s, &m) < 0)
        return NULL;
    if (get_vector(leaves_obj, &lb, "lqn", 0, "leaves") < 0) {
        release_levels(&m);
        release_levels(&s);
        return NULL;
    }
    PyObject *result = NULL;
    const int64_t *leaves = lb.buf;
    Py_ssize_t n = lb.len / 8, depth = s.n - 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t node = leaves[i];
        if (node < 0 || node >= LEN(&s, depth)) {
            PyErr_SetString(PyExc_IndexError, "leaf index out of range");
            goto done;
        }
        if (refresh_leaf(&s, &m, node, k) < 0)
            goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&lb);
    release_levels(&m);
    release_levels(&s);
    return result;
}

PyDoc_STRVAR(refresh_range_doc,
"refresh_range(sums, mins, lo, hi, fanout)\n\n"
"Recompute the ancestors of leaves lo .. hi - 1 from their children, bottom up.");

static PyObject *refresh_range(PyObject *self, PyObject *args)
{
    PyObject *sums_obj, *mins_obj;
    Py_ssize_t lo, hi, k;
    Levels s, m;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOnnn:refresh_range", &sums_obj, &mins_obj, &lo, &hi, &k))
        return NULL;
    if (k < 2) {
        PyErr_SetString(PyExc_ValueError, "fanout must be >= 2");
        return NULL;
    }
    if (get_tree(sums_obj, mins_obj, &s, &m) < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t depth = s.n - 1;
    if (lo < 0 || hi > LEN(&s, depth)) {
        PyErr_SetString(PyExc_IndexError, "leaf range out of range");
        goto done;
    }
    if (hi > lo) {
        for (Py_ssize_t level = depth - 1; level >= 0; level--) {
            lo /= k;
            hi = (hi - 1) / k + 1;
            for (Py_ssize_t node = lo; node < hi; node++)
                if (recompute(&s, &m, (int)level, node, k) < 0) {
                    PyErr_SetString(PyExc_ValueError, "a level is too short for its parents");
                    goto done;
                }
        }
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    release_levels(&m);
    release_levels(&s);
    return result;
}

PyDoc_STRVAR(update_live_doc,
"update_live(sums, mins, fanout, tokens, values, raw, block_gen, flags, block_size, num_slots,\n"
"            valid_bit) -> (stale, top)\n\n"
"The tree side of ReplayMemory.update_priorities in one call. A token (int64) is\n"
"generation * num_slots + slot; it is live when block_gen[slot // block_size] is still its\n"
"generation and flags[slot] (uint8) has valid_bit. Each live token's leaf is set to values[i]\n"
"(float64, > 0), the last of repeated slots winning, and the ancestors of the leaves set are\n"
"recomputed. Returns the count of tokens not live and the largest raw[i] of the tokens whose\n"
"value was kept (-1.0: none). Raises ValueError, changing nothing, when a token is negative\n"
"or names a generation newer than its block's.");

static PyObject *update_live(PyObject *self, PyObject *args)
{
    PyObject *sums_obj, *mins_obj, *tok_obj, *val_obj, *raw_obj, *gen_obj, *flags_obj;
    Py_ssize_t k, bs, num_slots;
    int valid_bit;
    Levels s, m;
    Py_buffer vec[4], fb;
    int got = 0, got_flags = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOnOOOOOnni:update_live", &sums_obj, &mins_obj, &k, &tok_obj,
                          &val_obj, &raw_obj, &gen_obj, &flags_obj, &bs, &num_slots, &valid_bit))
        return NULL;
    if (k < 2 || bs < 1 || num_slots < 1) {
        PyErr_SetString(PyExc_ValueError, "fanout must be >= 2, block_size and num_slots >= 1");
        return NULL;
    }
    if (get_tree(sums_obj, mins_obj, &s, &m) < 0)
        return NULL;
    PyObject *result = NULL;
    PyObject *objs[4] = {tok_obj, val_obj, raw_obj, gen_obj};
    const char *fmts[4] = {"lqn", "d", "d", "lqn"};
    const char *names[4] = {"tokens", "values", "raw", "block_gen"};
    for (; got < 4; got++)
        if (get_vector(objs[got], &vec[got], fmts[got], 0, names[got]) < 0)
            goto done;
    if (PyObject_GetBuffer(flags_obj, &fb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        goto done;
    got_flags = 1;
    if (fb.ndim != 1 || fb.itemsize != 1) {
        PyErr_SetString(PyExc_ValueError, "flags must be a 1-D uint8 array");
        goto done;
    }
    const int64_t *tok = vec[0].buf, *gen = vec[3].buf;
    const double *val = vec[1].buf, *raw = vec[2].buf;
    const uint8_t *flags = fb.buf;
    Py_ssize_t n = vec[0].len / 8, depth = s.n - 1;
    if (vec[1].len / 8 != n || vec[2].len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "tokens, values and raw must have the same length");
        goto done;
    }
    if (LEN(&s, depth) < num_slots || fb.len < num_slots || (vec[3].len / 8) * bs < num_slots) {
        PyErr_SetString(PyExc_ValueError, "the leaves, flags or block_gen are shorter than num_slots");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {      /* check everything before changing anything */
        if (tok[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "indices must come from sample(): negative index");
            goto done;
        }
        if (tok[i] / num_slots > gen[(tok[i] % num_slots) / bs]) {
            PyErr_SetString(PyExc_ValueError, "indices must come from sample(): an index names a "
                            "slot generation this memory has not written");
            goto done;
        }
    }
    double *ls = DATA(&s, depth), *lm = DATA(&m, depth);
    Py_ssize_t stale = 0;
    double top = -1.0;
    /* Last first, so that the last of repeated slots is the one kept: a kept slot's min leaf is
       NaN until the pass below (no leaf value is NaN: the caller checked the priorities). */
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        Py_ssize_t slot = tok[i] % num_slots;
        if (tok[i] / num_slots != gen[slot / bs] || !(flags[slot] & valid_bit)) {
            stale++;
            continue;
        }
        if (lm[slot] != lm[slot])
            continue;                          /* a later token of this slot won */
        ls[slot] = val[i];
        lm[slot] = NAN;
        if (raw[i] > top)
            top = raw[i];
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t slot = tok[i] % num_slots;
        if (tok[i] / num_slots != gen[slot / bs] || !(flags[slot] & valid_bit))
            continue;
        if (lm[slot] != lm[slot])
            lm[slot] = ls[slot] > 0 ? ls[slot] : INFINITY;
        if (refresh_leaf(&s, &m, slot, k) < 0)
            goto done;
    }
    result = Py_BuildValue("nd", stale, top);
done:
    if (got_flags)
        PyBuffer_Release(&fb);
    while (got > 0)
        PyBuffer_Release(&vec[--got]);
    release_levels(&m);
    release_levels(&s);
    return result;
}

static PyMethodDef methods[] = {
    {"find", find, METH_VARARGS, find_doc},
    {"refresh", refresh, METH_VARARGS, refresh_doc},
    {"refresh_range", refresh_range, METH_VARARGS, refresh_range_doc},
    {"update_live", update_live, METH_VARARGS, update_live_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_tree_ext",
    .m_doc = "Optional C accelerator for expreplay.storage.priority (sum/min tree descent and updates).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__tree_ext(void) { return PyModule_Create(&module); }
