/* Optional accelerator for expreplay/storage/_gather.py: gather + channels-last interleave, one pass.
 *
 * Why C at all: a channels-last batch (B, H, W, K) of uint8 frames puts every byte K bytes
 * after its neighbour, so it cannot be built from whole-frame copies. numpy's strided byte
 * copy moves about one byte per cycle, 4-5x slower than gathering the frames themselves.
 * Here 16 pixels of the K history frames are loaded into SSE2 registers, byte-transposed
 * with unpack instructions into one 8-byte word per pixel, and each word is written with a
 * single store (five frames, the commonest case, are assembled into whole 16-byte stores
 * with SSSE3 shuffles instead; see interleave_row5), with the GIL released.
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

#if defined(HAVE_SSE2) && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <tmmintrin.h>
#define HAVE_ROW5 1
/* Five frames: tensorpack's comb_state (history 4 and the next state), the commonest K.
 * interleave_row writes each pixel's 5 bytes with an 8-byte store, sixteen stores per 16
 * pixels; here those 80 bytes are assembled in five registers with byte shuffles and written
 * with five 16-byte stores (sample_batch ~13% faster on a 1M-step memory). The shuffle needs
 * SSSE3, checked at import: the build's baseline is SSE2. The four-frame words are built as
 * for K = 4 (q[0..3], four pixels each); output register j takes its bytes from q[QLO[j]],
 * from the register after it and from frame 4, with the masks row5_init sets. */
static const int ROW5_QLO[5] = {0, 0, 1, 2, 3};
static uint8_t row5_mask[5][3][16];
static int row5_ok;

static void row5_init(void)
{
    for (int j = 0; j < 5; j++)
        for (int i = 0; i < 16; i++) {
            int t = 16 * j + i, pix = t / 5, ch = t % 5;
            uint8_t *m = &row5_mask[j][0][i];
            m[0] = m[16] = m[32] = 0x80;             /* 0x80: the shuffle writes a zero */
            if (ch == 4)
                m[32] = (uint8_t)pix;
            else
                m[pix / 4 == ROW5_QLO[j] ? 0 : 16] = (uint8_t)((pix % 4) * 4 + ch);
        }
    __builtin_cpu_init();
    row5_ok = __builtin_cpu_supports("ssse3");
}

__attribute__((target("ssse3")))
static void interleave_row5(uint8_t *dst, const uint8_t *const *src, const uint8_t *const *next,
                            Py_ssize_t n)
{
    Py_ssize_t p = 0;
    for (; p + 16 <= n; p += 16) {
        if (next && p % 64 == 0)
            for (int j = 0; j < 5; j++)
                _mm_prefetch((const char *)next[j] + p, _MM_HINT_T0);
        __m128i a = _mm_loadu_si128((const __m128i *)(src[0] + p));
        __m128i b = _mm_loadu_si128((const __m128i *)(src[1] + p));
        __m128i c = _mm_loadu_si128((const __m128i *)(src[2] + p));
        __m128i d = _mm_loadu_si128((const __m128i *)(src[3] + p));
        __m128i e = _mm_loadu_si128((const __m128i *)(src[4] + p));
        __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
        __m128i cd0 = _mm_unpacklo_epi8(c, d), cd1 = _mm_unpackhi_epi8(c, d);
        /* q[4] = e only so that q[QLO[4] + 1] exists; its mask there is all zeros. */
        __m128i q[5] = {_mm_unpacklo_epi16(ab0, cd0), _mm_unpackhi_epi16(ab0, cd0),
                        _mm_unpacklo_epi16(ab1, cd1), _mm_unpackhi_epi16(ab1, cd1), e};
        uint8_t *o = dst + p * 5;
        for (int j = 0; j < 5; j++) {
            const __m128i *m = (const __m128i *)row5_mask[j];
            __m128i v = _mm_or_si128(_mm_shuffle_epi8(q[ROW5_QLO[j]], _mm_loadu_si128(m)),
                                     _mm_shuffle_epi8(q[ROW5_QLO[j] + 1], _mm_loadu_si128(m + 1)));
            v = _mm_or_si128(v, _mm_shuffle_epi8(e, _mm_loadu_si128(m + 2)));
            _mm_storeu_si128((__m128i *)(o + 16 * j), v);
        }
    }
    for (; p < n; p++)  /* row tail */
        for (int j = 0; j < 5; j++)
            dst[p * 5 + j] = src[j][p];
}
#endif

static void interleave_rows(uint8_t *out, const uint8_t **src, Py_ssize_t B, Py_ssize_t n, int K)
{
#ifdef HAVE_ROW5
    if (K == 5 && row5_ok) {
        for (Py_ssize_t r = 0; r < B; r++)
            interleave_row5(out + r * 5 * n, src + r * 5, r + 1 < B ? src + (r + 1) * 5 : NULL, n);
        return;
    }
#endif
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

/* ------------------------------------------------------------------ the memory's sampler
 *
 * Ring: a binding to one replay memory's arrays (frames, epstep, flags, action, reward, the
 * block links and generations), built once by expreplay/storage/memory.py, so that a batch is drawn
 * with one call that takes only the batch's slots and its output buffers. It resolves every
 * transition's frames (the history rule of ReplayMemory._history_index, the n-step walk of
 * ReplayMemory._n_step) while holding the GIL (raising needs it, and the memory's lock keeps
 * the tables still), then copies with the GIL released when the batch is large enough. The
 * state and the next state of a row are built one after the other, so the frames they share
 * are read from memory once. */

#define F_VALID 1
#define F_TERMINATED 2
#define F_HAS_ACTION 8

typedef struct {
    PyObject_HEAD
    Py_buffer fr, ep, fl, ac, rw, pv, nx, gen, fill;
    int nbuf;              /* buffers acquired, for the destructor */
    Py_ssize_t N, n, h, bs, zero, nslots, nblocks;
} RingObject;

static Py_buffer *ring_bufs(RingObject *r, int i)
{
    Py_buffer *all[9] = {&r->fr, &r->ep, &r->fl, &r->ac, &r->rw, &r->pv, &r->nx, &r->gen, &r->fill};
    return all[i];
}

static void Ring_dealloc(RingObject *r)
{
    for (int i = 0; i < r->nbuf; i++)
        PyBuffer_Release(ring_bufs(r, i));
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static int Ring_init(RingObject *r, PyObject *args, PyObject *kw)
{
    PyObject *o[9];
    static const Py_ssize_t item[9] = {0, 4, 1, 4, 4, 8, 8, 8, 8};
    static const char *names[9] = {"frames", "epstep", "flags", "action", "reward", "block_prev",
                                   "block_next", "block_gen", "block_fill"};
    (void)kw;
    if (r->nbuf) {
        PyErr_SetString(PyExc_TypeError, "Ring is initialised once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOOOOnnn:Ring", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &o[8], &r->h, &r->bs, &r->zero))
        return -1;
    for (int i = 0; i < 9; i++) {
        if (PyObject_GetBuffer(o[i], ring_bufs(r, i), PyBUF_C_CONTIGUOUS | (i == 0 ? PyBUF_ND : 0)) < 0)
            return -1;
        r->nbuf = i + 1;
        if (item[i] && ring_bufs(r, i)->itemsize != item[i]) {
            PyErr_Format(PyExc_ValueError, "Ring: %s has items of the wrong size", names[i]);
            return -1;
        }
    }
    r->N = r->fr.ndim >= 1 ? r->fr.shape[0] : 0;
    r->n = r->N ? r->fr.len / r->N : 0;
    r->nslots = r->ep.len / 4;
    r->nblocks = r->pv.len / 8;
    if (r->fr.ndim < 2 || r->h < 1 || r->bs < 1 || r->zero < 0 || r->zero >= r->N
        || r->fl.len != r->nslots || r->ac.len != 4 * r->nslots || r->rw.len != 4 * r->nslots
        || r->nx.len != 8 * r->nblocks || r->gen.len != 8 * r->nblocks
        || r->fill.len != 8 * r->nblocks
        || r->nblocks * r->bs != r->nslots || r->N <= r->nslots) {
        PyErr_SetString(PyExc_ValueError, "Ring: inconsistent table sizes");
        return -1;
    }
    return 0;
}

/* The frames of the state whose newest frame is `s` (oldest first) into src[0 .. h-1]. */
static int ring_history(RingObject *r, int64_t s, const uint8_t **src)
{
    const int32_t *epstep = r->ep.buf;
    const int64_t *prev = r->pv.buf;
    const uint8_t *base = r->fr.buf;
    int64_t bs = r->bs, blk = s / bs, off = s % bs, e = epstep[s];
    for (Py_ssize_t k = 0; k < r->h; k++) {
        int64_t back = r->h - 1 - k, f;
        if (back > e)
            f = r->zero;
        else if (off - back >= 0)
            f = blk * bs + off - back;
        else
            f = prev[blk] * bs + bs + off - back;
        if (back <= e && (f < 0 || f >= r->nslots)) {
            PyErr_Format(PyExc_IndexError, "sample: the history of slot %lld leaves the ring",
                         (long long)s);
            return -1;
        }
        src[k] = base + f * r->n;
    }
    return 0;
}

/* The slot after `s` in its lane, or -1. */
static inline int64_t ring_next(RingObject *r, int64_t s)
{
    int64_t bs = r->bs, off = s % bs;
    if (off + 1 < bs)
        return s + 1;
    int64_t b = ((const int64_t *)r->nx.buf)[s / bs];
    return b < 0 ? -1 : b * bs;
}

static int out_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t len, const char *fmt,
                      const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (view->len != len || (fmt && strcmp(f, fmt) != 0)) {
        PyErr_Format(PyExc_ValueError, "out.%s has the wrong size or dtype for this batch", name);
        PyBuffer_Release(view);
        view->obj = NULL;
        return -1;
    }
    return 0;
}

/* Copy B rows of K frames (src[r * K + k]) into out: NCHW (whole frames) or NHWC
 * (interleaved; 1-byte items, K <= 8, or K == 1). GIL held on entry. */
static void copy_rows(uint8_t *out, const uint8_t **src, Py_ssize_t B, Py_ssize_t n, int K, int nchw)
{
    if (nchw || K == 1) {
        for (Py_ssize_t i = 0; i < B * K; i++)
            memcpy(out + i * n, src[i], n);
    } else {
        interleave_rows(out, src, B, n, K);
    }
}

#ifdef HAVE_SSE2
/* Sixteen pixels of four planes -> 64 output bytes. (Non-temporal stores were tried here:
 * with two output rows written side by side they were several times slower.) */
ALWAYS_INLINE void emit4(uint8_t *o, __m128i a, __m128i b, __m128i c, __m128i d)
{
    __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
    __m128i cd0 = _mm_unpacklo_epi8(c, d), cd1 = _mm_unpackhi_epi8(c, d);
    _mm_storeu_si128((__m128i *)(o + 0), _mm_unpacklo_epi16(ab0, cd0));
    _mm_storeu_si128((__m128i *)(o + 16), _mm_unpackhi_epi16(ab0, cd0));
    _mm_storeu_si128((__m128i *)(o + 32), _mm_unpacklo_epi16(ab1, cd1));
    _mm_storeu_si128((__m128i *)(o + 48), _mm_unpackhi_epi16(ab1, cd1));
}

/* A row's state and next state of 4 frames each, in one pass over the pixels: the frames they
 * share (3 of the 5 for a one-step window) are loaded from memory once, and the second load
 * of each 16 pixels hits the L1 cache. n % 16 == 0. ns/nn: the next
 * row's frames, prefetched meanwhile (NULL: none). */
static void pair_row4(uint8_t *os, uint8_t *on, const uint8_t *const *ss,
                      const uint8_t *const *sn, const uint8_t *const *ns,
                      const uint8_t *const *nn, Py_ssize_t n)
{
    for (Py_ssize_t p = 0; p < n; p += 16) {
        if (ns && p % 64 == 0)
            for (int j = 0; j < 4; j++) {
                _mm_prefetch((const char *)ns[j] + p, _MM_HINT_T0);
                _mm_prefetch((const char *)nn[j] + p, _MM_HINT_T0);
            }
#define LD(f) _mm_loadu_si128((const __m128i *)((f) + p))
        emit4(os + p * 4, LD(ss[0]), LD(ss[1]), LD(ss[2]), LD(ss[3]));
        emit4(on + p * 4, LD(sn[0]), LD(sn[1]), LD(sn[2]), LD(sn[3]));
#undef LD
    }
}
#endif

/* State and next state, row by row: the next state's frames are mostly the state's. */
static void copy_pairs(uint8_t *os, uint8_t *on, const uint8_t **ss, const uint8_t **sn,
                       Py_ssize_t B, Py_ssize_t n, int K, int nchw)
{
    if (nchw || K == 1) {
        for (Py_ssize_t r = 0; r < B; r++) {
            for (int k = 0; k < K; k++)
                memcpy(os + (r * K + k) * n, ss[r * K + k], n);
            for (int k = 0; k < K; k++)
                memcpy(on + (r * K + k) * n, sn[r * K + k], n);
        }
        return;
    }
#ifdef HAVE_SSE2
    if (K == 4 && n % 16 == 0) {
        for (Py_ssize_t r = 0; r < B; r++)
            pair_row4(os + r * 4 * n, on + r * 4 * n, ss + r * 4, sn + r * 4,
                      r + 1 < B ? ss + (r + 1) * 4 : NULL, r + 1 < B ? sn + (r + 1) * 4 : NULL, n);
        return;
    }
#endif
#define CASE(k) case k: \
        for (Py_ssize_t r = 0; r < B; r++) { \
            interleave_row(os + r * k * n, ss + r * k, sn + r * k, n, k); \
            interleave_row(on + r * k * n, sn + r * k, r + 1 < B ? ss + (r + 1) * k : NULL, n, k); \
        } \
        break;
    switch (K) { CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) }
#undef CASE
}

static int ring_layout_ok(RingObject *r, Py_ssize_t K, int nchw)
{
    if (!nchw && K > 1 && (r->fr.itemsize != 1 || K > 8)) {
        PyErr_SetString(PyExc_ValueError, "Ring: channels-last needs 1-byte frames and at most 8 of them");
        return 0;
    }
    return 1;
}

static int ring_slots(RingObject *r, PyObject *obj, Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "Ring: slots must be int64");
        return -1;
    }
    const int64_t *s = view->buf;
    for (Py_ssize_t i = 0; i < view->len / 8; i++)
        if (s[i] < 0 || s[i] >= r->nslots) {
            PyErr_Format(PyExc_IndexError, "Ring: slot %lld out of range", (long long)s[i]);
            return -1;
        }
    return 0;
}

PyDoc_STRVAR(ring_sample_doc,
"sample(slots, n_step, gamma, nchw, state, next_state, action, reward, discount, is_over, indices)\n\n"
"ReplayMemory.sample's batch for the (VALID) int64 slots, written into the given buffers:\n"
"state/next_state (B, history_len frames) in the layout asked, action int32, reward and\n"
"discount float32, is_over bool, indices int64 (block_gen * num_slots + slot). The n-step walk\n"
"stops at the episode's end, so its cost is bounded by the episode, not by n_step.");

static PyObject *Ring_sample(RingObject *r, PyObject *args)
{
    PyObject *slots_obj, *o[7];
    Py_ssize_t nstep;
    double gamma;
    int nchw;
    if (!PyArg_ParseTuple(args, "OndpOOOOOOO:sample", &slots_obj, &nstep, &gamma, &nchw,
                          &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    Py_buffer sl = {0}, v[7];
    memset(v, 0, sizeof(v));
    const uint8_t **src = NULL;
    PyObject *result = NULL;
    if (ring_slots(r, slots_obj, &sl) < 0 || !ring_layout_ok(r, r->h, nchw))
        goto done;
    Py_ssize_t B = sl.len / 8, K = r->h, n = r->n;
    const Py_ssize_t lens[7] = {B * K * n, B * K * n, 4 * B, 4 * B, 4 * B, B, 8 * B};
    static const char *fmts[7] = {NULL, NULL, "i", "f", "f", "?", NULL};
    static const char *names[7] = {"state", "next_state", "action", "reward", "discount",
                                   "is_over", "indices"};
    for (int i = 0; i < 7; i++)
        if (out_buffer(o[i], &v[i], lens[i], fmts[i], names[i]) < 0)
            goto done;
    if (v[6].itemsize != 8 || v[0].itemsize != r->fr.itemsize || v[1].itemsize != r->fr.itemsize) {
        PyErr_SetString(PyExc_ValueError, "out: wrong item sizes");
        goto done;
    }
    src = PyMem_Malloc((size_t)(2 * B * K + 1) * sizeof(*src));
    if (!src) { PyErr_NoMemory(); goto done; }
    const int64_t *slots = sl.buf, *gen = r->gen.buf;
    const uint8_t *flags = r->fl.buf;
    const float *rew = r->rw.buf;
    const int32_t *act = r->ac.buf;
    int32_t *a_out = v[2].buf;
    float *r_out = v[3].buf, *d_out = v[4].buf;
    uint8_t *o_out = v[5].buf;
    int64_t *i_out = v[6].buf;
    for (Py_ssize_t b = 0; b < B; b++) {
        int64_t s = slots[b], cur = s;
        double total = 0.0, disc = 1.0;
        int term = 0;
        for (Py_ssize_t j = 0; j < nstep; j++) {
            uint8_t f = flags[cur];
            total += disc * (double)rew[cur];
            disc *= gamma;
            int64_t nxt = ring_next(r, cur);
            if (nxt < 0 || nxt >= r->nslots) {
                PyErr_Format(PyExc_IndexError, "sample: the step from slot %lld has no next frame",
                             (long long)cur);
                goto done;
            }
            cur = nxt;
            if (f & F_TERMINATED) { term = 1; break; }
            if (!(flags[cur] & F_HAS_ACTION)) break;   /* the episode's final frame */
        }
        a_out[b] = act[s];
        r_out[b] = (float)total;
        d_out[b] = term ? 0.0f : (float)disc;
        o_out[b] = (uint8_t)term;
        i_out[b] = gen[s / r->bs] * r->nslots + s;
        if (ring_history(r, s, src + b * K) < 0 || ring_history(r, cur, src + (B + b) * K) < 0)
            goto done;
    }
    if (2 * B * K * n >= GIL_RELEASE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        copy_pairs(v[0].buf, v[1].buf, src, src + B * K, B, n, (int)K, nchw);
        Py_END_ALLOW_THREADS
    } else {
        copy_pairs(v[0].buf, v[1].buf, src, src + B * K, B, n, (int)K, nchw);
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_Free(src);
    if (sl.obj) PyBuffer_Release(&sl);
    for (int i = 0; i < 7; i++)
        if (v[i].obj) PyBuffer_Release(&v[i]);
    return result;
}

PyDoc_STRVAR(ring_comb_doc,
"comb(slots, nchw, comb_state, action, reward, is_over)\n\n"
"ReplayMemory.sample_batch's batch for the (VALID) int64 slots, written into the buffers:\n"
"comb_state (B, history_len + 1 frames: the state, then the next frame), action int32,\n"
"reward float32, is_over bool (terminated).");

static PyObject *Ring_comb(RingObject *r, PyObject *args)
{
    PyObject *slots_obj, *o[4];
    int nchw;
    if (!PyArg_ParseTuple(args, "OpOOOO:comb", &slots_obj, &nchw, &o[0], &o[1], &o[2], &o[3]))
        return NULL;
    Py_buffer sl = {0}, v[4];
    memset(v, 0, sizeof(v));
    const uint8_t **src = NULL;
    PyObject *result = NULL;
    Py_ssize_t K = r->h + 1;
    if (ring_slots(r, slots_obj, &sl) < 0 || !ring_layout_ok(r, K, nchw))
        goto done;
    Py_ssize_t B = sl.len / 8, n = r->n;
    const Py_ssize_t lens[4] = {B * K * n, 4 * B, 4 * B, B};
    static const char *fmts[4] = {NULL, "i", "f", "?"};
    static const char *names[4] = {"comb_state", "action", "reward", "is_over"};
    for (int i = 0; i < 4; i++)
        if (out_buffer(o[i], &v[i], lens[i], fmts[i], names[i]) < 0)
            goto done;
    if (v[0].itemsize != r->fr.itemsize) {
        PyErr_SetString(PyExc_ValueError, "out: wrong item size");
        goto done;
    }
    src = PyMem_Malloc((size_t)(B * K + 1) * sizeof(*src));
    if (!src) { PyErr_NoMemory(); goto done; }
    const int64_t *slots = sl.buf;
    const uint8_t *flags = r->fl.buf;
    for (Py_ssize_t b = 0; b < B; b++) {
        int64_t s = slots[b], nxt = ring_next(r, s);
        if (nxt < 0 || nxt >= r->nslots) {
            PyErr_Format(PyExc_IndexError, "sample_batch: the step from slot %lld has no next frame",
                         (long long)s);
            goto done;
        }
        if (ring_history(r, s, src + b * K) < 0)
            goto done;
        src[b * K + K - 1] = (const uint8_t *)r->fr.buf + nxt * n;
        ((int32_t *)v[1].buf)[b] = ((const int32_t *)r->ac.buf)[s];
        ((float *)v[2].buf)[b] = ((const float *)r->rw.buf)[s];
        ((uint8_t *)v[3].buf)[b] = (flags[s] & F_TERMINATED) != 0;
    }
    if (B * K * n >= GIL_RELEASE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        copy_rows(v[0].buf, src, B, n, (int)K, nchw);
        Py_END_ALLOW_THREADS
    } else {
        copy_rows(v[0].buf, src, B, n, (int)K, nchw);
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_Free(src);
    if (sl.obj) PyBuffer_Release(&sl);
    for (int i = 0; i < 4; i++)
        if (v[i].obj) PyBuffer_Release(&v[i]);
    return result;
}

PyDoc_STRVAR(ring_written_doc,
"written() -> the number of written slots (the sum of block_fill).");

static PyObject *Ring_written(RingObject *r, PyObject *unused)
{
    const int64_t *fill = r->fill.buf;
    int64_t total = 0;
    (void)unused;
    for (Py_ssize_t b = 0; b < r->nblocks; b++)
        total += fill[b];
    return PyLong_FromLongLong(total);
}

PyDoc_STRVAR(ring_pick_doc,
"pick(u, out, got) -> got'\n\n"
"ReplayMemory._draw_valid_slots' mapping: each u (int64, in [0, written())) names the u-th\n"
"written slot, counting block by block (the slots [0, block_fill[b]) of each block b); those\n"
"that are VALID are stored in out[got:] (int64) in order until out is full. Returns the new\n"
"count.");

static PyObject *Ring_pick(RingObject *r, PyObject *args)
{
    PyObject *u_obj, *out_obj;
    Py_ssize_t got;
    if (!PyArg_ParseTuple(args, "OOn:pick", &u_obj, &out_obj, &got))
        return NULL;
    Py_buffer u = {0}, out = {0};
    int64_t *cum = NULL;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(u_obj, &u, PyBUF_C_CONTIGUOUS) < 0
        || PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    if (u.itemsize != 8 || out.itemsize != 8 || got < 0 || got > out.len / 8) {
        PyErr_SetString(PyExc_ValueError, "pick: u and out must be int64, 0 <= got <= len(out)");
        goto done;
    }
    cum = PyMem_Malloc((size_t)(r->nblocks + 1) * sizeof(*cum));
    if (!cum) { PyErr_NoMemory(); goto done; }
    const int64_t *fill = r->fill.buf, *uv = u.buf;
    int64_t *o = out.buf;
    const uint8_t *flags = r->fl.buf;
    cum[0] = 0;
    for (Py_ssize_t b = 0; b < r->nblocks; b++)
        cum[b + 1] = cum[b] + fill[b];                 /* cum[b]: written slots before block b */
    Py_ssize_t n = out.len / 8, nb = r->nblocks;
    for (Py_ssize_t i = 0; i < u.len / 8 && got < n; i++) {
        int64_t x = uv[i];
        if (x < 0 || x >= cum[nb]) {
            PyErr_SetString(PyExc_IndexError, "pick: u out of range");
            goto done;
        }
        Py_ssize_t lo = 0, hi = nb;                    /* the block b with cum[b] <= x < cum[b + 1] */
        while (hi - lo > 1) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (cum[mid] <= x) lo = mid; else hi = mid;
        }
        int64_t slot = lo * r->bs + (x - cum[lo]);
        if (flags[slot] & F_VALID)
            o[got++] = slot;
    }
    result = PyLong_FromSsize_t(got);
done:
    PyMem_Free(cum);
    if (u.obj) PyBuffer_Release(&u);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

static PyMethodDef ring_methods[] = {
    {"written", (PyCFunction)Ring_written, METH_NOARGS, ring_written_doc},
    {"pick", (PyCFunction)Ring_pick, METH_VARARGS, ring_pick_doc},
    {"sample", (PyCFunction)Ring_sample, METH_VARARGS, ring_sample_doc},
    {"comb", (PyCFunction)Ring_comb, METH_VARARGS, ring_comb_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "expreplay.storage._gather_ext.Ring",
    .tp_basicsize = sizeof(RingObject),
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ring(frames, epstep, flags, action, reward, block_prev, block_next, block_gen, block_fill, "
              "history_len, block_size, zero_slot): a replay memory's sampler, bound to its tables.",
    .tp_methods = ring_methods,
    .tp_init = (initproc)Ring_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"interleave", interleave, METH_VARARGS, interleave_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_gather_ext",
    .m_doc = "Optional C accelerator for expreplay.storage._gather (channels-last frame gather).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__gather_ext(void)
{
#ifdef HAVE_ROW5
    row5_init();
#endif
    if (PyType_Ready(&RingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
