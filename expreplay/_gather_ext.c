/* Optional accelerator for expreplay/_gather.py: gather + channels-last interleave, one pass.
 *
 * Why C at all: a channels-last batch (B, H, W, K) of uint8 frames puts every byte K bytes
 * after its neighbour, so it cannot be built from whole-frame copies. numpy's strided byte
 * copy moves about one byte per cycle, 4-5x slower than gathering the frames themselves.
 * Here 16 pixels of the K history frames are loaded into SSE2 registers, byte-transposed
 * with unpack instructions into one 8-byte word per pixel, and each word is written with a
 * single store: the batch is built at roughly memcpy speed, with the GIL released.
 *
 * Plain CPython C API + buffer protocol (no numpy headers). Only 1-byte items and
 * 2 <= K <= 8 are handled; _gather.py uses numpy for everything else, and when this
 * module is not built at all.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define GIL_RELEASE_BYTES (1 << 20)
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

/* The row kernel is instantiated once per K: it must be inlined so that K is a constant,
 * which lets the compiler drop the unused planes and fix the store offsets. */
#if defined(__GNUC__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define ALWAYS_INLINE static __forceinline
#else
#define ALWAYS_INLINE static inline
#endif

#ifdef HAVE_SSE2
/* Four pixels: lo4 holds bytes 0-3 of each pixel's word (frames 0-3), hi4 bytes 4-7. */
ALWAYS_INLINE void store4(uint8_t *o, __m128i lo4, __m128i hi4, const int K)
{
    /* K = 8 fills whole registers: two 16-byte stores, not four overlapping 8-byte ones.
     * (K = 4 has a loop of its own in interleave_row.) */
    if (K == 8) {
        _mm_storeu_si128((__m128i *)o, _mm_unpacklo_epi32(lo4, hi4));
        _mm_storeu_si128((__m128i *)(o + 16), _mm_unpackhi_epi32(lo4, hi4));
        return;
    }
    __m128i w01 = _mm_unpacklo_epi32(lo4, hi4), w23 = _mm_unpackhi_epi32(lo4, hi4);
    _mm_storel_epi64((__m128i *)(o + 0 * K), w01);
    _mm_storel_epi64((__m128i *)(o + 1 * K), _mm_unpackhi_epi64(w01, w01));
    _mm_storel_epi64((__m128i *)(o + 2 * K), w23);
    _mm_storel_epi64((__m128i *)(o + 3 * K), _mm_unpackhi_epi64(w23, w23));
}
#endif

/* One batch row: src[j] is history frame j (n bytes); dst gets n pixels of K bytes each.
 * next: the next row's frames (or NULL), prefetched while this row is built. The frames are
 * scattered across a ring far larger than the caches, and the hardware prefetcher only starts
 * a stream after a few misses (and stops at page ends); this made the row ~25% faster. */
ALWAYS_INLINE void interleave_row(uint8_t *dst, const uint8_t *const *src,
                                  const uint8_t *const *next, Py_ssize_t n, const int K)
{
    Py_ssize_t p = 0;
#ifdef HAVE_SSE2
    /* Each 8-byte store writes a pixel's K bytes plus 8-K bytes of padding that spill into
     * the next pixel(s), which are stored right after and overwrite it. Stop 3 pixels before
     * the row end (8-K <= 6 bytes of spill for K >= 2) so nothing is written past the row. */
    const __m128i z = _mm_setzero_si128();
    if (K == 4) {
        /* Four frames: a pixel's word is exactly 4 bytes, so four pixels fill one 16-byte
         * store with no spill (half the stores, and no bytes written twice). */
        for (; p + 16 <= n; p += 16) {
            if (next && p % 64 == 0)
                for (int j = 0; j < 4; j++)
                    _mm_prefetch((const char *)next[j] + p, _MM_HINT_T0);
            __m128i a = _mm_loadu_si128((const __m128i *)(src[0] + p));
            __m128i b = _mm_loadu_si128((const __m128i *)(src[1] + p));
            __m128i c = _mm_loadu_si128((const __m128i *)(src[2 % K] + p));
            __m128i d = _mm_loadu_si128((const __m128i *)(src[3 % K] + p));
            __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
            __m128i cd0 = _mm_unpacklo_epi8(c, d), cd1 = _mm_unpackhi_epi8(c, d);
            uint8_t *o = dst + p * 4;
            _mm_storeu_si128((__m128i *)(o + 0), _mm_unpacklo_epi16(ab0, cd0));
            _mm_storeu_si128((__m128i *)(o + 16), _mm_unpackhi_epi16(ab0, cd0));
            _mm_storeu_si128((__m128i *)(o + 32), _mm_unpacklo_epi16(ab1, cd1));
            _mm_storeu_si128((__m128i *)(o + 48), _mm_unpackhi_epi16(ab1, cd1));
        }
    } else
#define PLANE(j) ((j) < K ? _mm_loadu_si128((const __m128i *)(src[(j) < K ? (j) : 0] + p)) : z)
    for (; p + 16 + 3 <= n; p += 16) {
        if (next && p % 64 == 0)  /* one cache line of each next frame per 64 pixels */
            for (int j = 0; j < K; j++)
                _mm_prefetch((const char *)next[j] + p, _MM_HINT_T0);
        __m128i a = PLANE(0), b = PLANE(1), c = PLANE(2), d = PLANE(3);
        __m128i e = PLANE(4), f = PLANE(5), g = PLANE(6), h = PLANE(7);
        /* bytes -> pairs -> quads: abcd0 = a0 b0 c0 d0 a1 b1 c1 d1 ... (pixels 0-3), etc. */
        __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
        __m128i cd0 = _mm_unpacklo_epi8(c, d), cd1 = _mm_unpackhi_epi8(c, d);
        __m128i ef0 = _mm_unpacklo_epi8(e, f), ef1 = _mm_unpackhi_epi8(e, f);
        __m128i gh0 = _mm_unpacklo_epi8(g, h), gh1 = _mm_unpackhi_epi8(g, h);
        uint8_t *o = dst + p * K;
        store4(o + 0 * K, _mm_unpacklo_epi16(ab0, cd0), _mm_unpacklo_epi16(ef0, gh0), K);
        store4(o + 4 * K, _mm_unpackhi_epi16(ab0, cd0), _mm_unpackhi_epi16(ef0, gh0), K);
        store4(o + 8 * K, _mm_unpacklo_epi16(ab1, cd1), _mm_unpacklo_epi16(ef1, gh1), K);
        store4(o + 12 * K, _mm_unpackhi_epi16(ab1, cd1), _mm_unpackhi_epi16(ef1, gh1), K);
    }
#undef PLANE
#endif
    for (; p < n; p++)  /* row tail (or everything, without SSE2) */
        for (int j = 0; j < K; j++)
            dst[p * K + j] = src[j][p];
}

static void interleave_rows(uint8_t *out, const uint8_t **src, Py_ssize_t B, Py_ssize_t n, int K)
{
#define CASE(k) case k: \
        for (Py_ssize_t r = 0; r < B; r++) \
            interleave_row(out + r * k * n, src + r * k, r + 1 < B ? src + (r + 1) * k : NULL, n, k); \
        break;
    switch (K) { CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) }
#undef CASE
}

/* interleave_rows, with the GIL released only for a copy long enough to be worth it (a
 * learner's batch, not a simulator's few states): a thread that dropped the GIL must win it
 * back, and a busy thread keeps it for up to the switch interval (5 ms), far longer than a
 * short copy. Called with the GIL held. */
static void interleave_rows_gil(void *out, const uint8_t **src, Py_ssize_t B, Py_ssize_t n, int K)
{
    if (B * K * n >= GIL_RELEASE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        interleave_rows((uint8_t *)out, src, B, n, K);
        Py_END_ALLOW_THREADS
    } else {
        interleave_rows((uint8_t *)out, src, B, n, K);
    }
}

PyDoc_STRVAR(interleave_doc,
"interleave(frames, idx, out)\n\n"
"out[b, p, j] = frames[idx[b, j]].flat[p] for 1-byte items: frames (N, ...) C-contiguous,\n"
"idx (B, K) intp C-contiguous with 2 <= K <= 8 (negative indices count from the end),\n"
"out writable C-contiguous with B*K*frames[0].size bytes. Releases the GIL while copying.");

static PyObject *interleave(PyObject *self, PyObject *args)
{
    PyObject *frames_obj, *idx_obj, *out_obj, *result = NULL;
    Py_buffer fr = {0}, ix = {0}, out = {0};
    const uint8_t **src = NULL;
    (void)self;

    if (!PyArg_ParseTuple(args, "OOO:interleave", &frames_obj, &idx_obj, &out_obj))
        return NULL;
    if (PyObject_GetBuffer(frames_obj, &fr, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(idx_obj, &ix, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0 ||
        PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;

    if (fr.ndim < 2 || fr.itemsize != 1 || out.itemsize != 1) {
        PyErr_SetString(PyExc_ValueError, "frames must be (N, ...) and frames, out of 1-byte items");
        goto done;
    }
    const char *fmt = ix.format;
    if (*fmt == '@' || *fmt == '=') fmt++;
    if (ix.ndim != 2 || ix.itemsize != sizeof(Py_ssize_t) || fmt[0] == '\0' || fmt[1] != '\0' ||
        !strchr("nlq", fmt[0])) {
        PyErr_SetString(PyExc_ValueError, "idx must be a 2-D intp array");
        goto done;
    }
    Py_ssize_t N = fr.shape[0], B = ix.shape[0], K = ix.shape[1];
    Py_ssize_t n = N ? fr.len / N : 0;  /* bytes per frame */
    if (K < 2 || K > 8) {
        PyErr_SetString(PyExc_ValueError, "idx must have 2 to 8 columns");
        goto done;
    }
    if (out.len != B * K * n) {
        PyErr_SetString(PyExc_ValueError, "out has the wrong size");
        goto done;
    }

    /* Resolve every slot to a frame pointer while holding the GIL (raising needs it). */
    src = PyMem_Malloc((size_t)(B * K + 1) * sizeof(*src));  /* +1: never malloc(0) */
    if (!src) { PyErr_NoMemory(); goto done; }
    const Py_ssize_t *slots = (const Py_ssize_t *)ix.buf;
    for (Py_ssize_t i = 0; i < B * K; i++) {
        Py_ssize_t s = slots[i] < 0 ? slots[i] + N : slots[i];
        if (s < 0 || s >= N) {
            PyErr_Format(PyExc_IndexError, "index %zd is out of bounds for %zd frames", slots[i], N);
            goto done;
        }
        src[i] = (const uint8_t *)fr.buf + s * n;
    }

    interleave_rows_gil(out.buf, src, B, n, (int)K);
    Py_INCREF(Py_None);
    result = Py_None;

done:
    PyMem_Free(src);
    if (fr.obj) PyBuffer_Release(&fr);
    if (ix.obj) PyBuffer_Release(&ix);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

PyDoc_STRVAR(gather_states_doc,
"gather_states(frames, epstep, block_prev, slots, out, history_len, block_size, zero_slot)\n\n"
"The replay memory's states in one pass: for each slot s, the history_len frames of its\n"
"episode ending at s (oldest first; the frame `back` steps before s is the zero slot when\n"
"back > epstep[s], else in s's block or, before its start, at the end of block_prev[block])\n"
"interleaved channels-last into out (B, *frame, history_len), as ReplayMemory._history_index\n"
"then interleave would. frames (N, ...) uint8 C-contiguous, epstep int32, block_prev and slots\n"
"int64, 2 <= history_len <= 8. Releases the GIL for large batches.");

static PyObject *gather_states(PyObject *self, PyObject *args)
{
    PyObject *frames_obj, *ep_obj, *prev_obj, *slots_obj, *out_obj, *result = NULL;
    Py_ssize_t K, bs, zero;
    Py_buffer fr = {0}, ep = {0}, pv = {0}, sl = {0}, out = {0};
    const uint8_t **src = NULL;
    (void)self;

    if (!PyArg_ParseTuple(args, "OOOOOnnn:gather_states", &frames_obj, &ep_obj, &prev_obj,
                          &slots_obj, &out_obj, &K, &bs, &zero))
        return NULL;
    if (PyObject_GetBuffer(frames_obj, &fr, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(ep_obj, &ep, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(prev_obj, &pv, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(slots_obj, &sl, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    if (fr.ndim < 2 || fr.itemsize != 1 || out.itemsize != 1 || ep.itemsize != 4 ||
        pv.itemsize != 8 || sl.itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "gather_states: frames and out must hold 1-byte items, "
                        "epstep int32, block_prev and slots int64");
        goto done;
    }
    if (K < 2 || K > 8 || bs < 1) {
        PyErr_SetString(PyExc_ValueError, "gather_states: history_len must be 2 to 8, block_size >= 1");
        goto done;
    }
    Py_ssize_t N = fr.shape[0], B = sl.len / 8, nep = ep.len / 4, nprev = pv.len / 8;
    Py_ssize_t n = N ? fr.len / N : 0;
    if (out.len != B * K * n) {
        PyErr_SetString(PyExc_ValueError, "gather_states: out has the wrong size");
        goto done;
    }
    if (zero < 0 || zero >= N) {
        PyErr_SetString(PyExc_IndexError, "gather_states: zero_slot out of range");
        goto done;
    }
    src = PyMem_Malloc((size_t)(B * K + 1) * sizeof(*src));
    if (!src) { PyErr_NoMemory(); goto done; }
    const int64_t *slots = sl.buf, *prev = pv.buf;
    const int32_t *epstep = ep.buf;
    const uint8_t *base = fr.buf;
    for (Py_ssize_t r = 0; r < B; r++) {
        int64_t s = slots[r];
        if (s < 0 || s >= nep || s / bs >= nprev) {
            PyErr_Format(PyExc_IndexError, "gather_states: slot %lld out of range", (long long)s);
            goto done;
        }
        int64_t blk = s / bs, off = s % bs, e = epstep[s];
        for (Py_ssize_t k = 0; k < K; k++) {
            int64_t back = K - 1 - k, f;
            if (back > e)
                f = zero;
            else if (off - back >= 0)
                f = blk * bs + off - back;
            else
                f = prev[blk] * bs + bs + off - back;
            if (f < 0 || f >= N) {
                PyErr_Format(PyExc_IndexError, "gather_states: history of slot %lld leaves the ring",
                             (long long)s);
                goto done;
            }
            src[r * K + k] = base + f * n;
        }
    }
    interleave_rows_gil(out.buf, src, B, n, (int)K);
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_Free(src);
    if (fr.obj) PyBuffer_Release(&fr);
    if (ep.obj) PyBuffer_Release(&ep);
    if (pv.obj) PyBuffer_Release(&pv);
    if (sl.obj) PyBuffer_Release(&sl);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"interleave", interleave, METH_VARARGS, interleave_doc},
    {"gather_states", gather_states, METH_VARARGS, gather_states_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_gather_ext",
    .m_doc = "Optional C accelerator for expreplay._gather (channels-last frame gather).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__gather_ext(void) { return PyModule_Create(&module); }
