/* x · Wᵀ on an MLX affine-quantized weight as it is stored: no fp32 copy of W anywhere.
 *
 * W (out × in) is MLX's triple: packed codes (row o's codes at w + o·in·bits/8, little-endian
 * words, values from the low bits up), and per group of `gs` inputs a scale and a bias, so that
 * W[o, i] = scales[o, g]·q[o, i] + biases[o, g]. Scales and biases are fp32, fp16 or bf16
 * (`scale_type`), read as they are and widened to fp32 in registers. Bits 4 and 8 are read in place; other widths are
 * widened or unpacked by the loader into one code a byte and read as 8 (kernels/quant_cpu.py).
 *
 * Few rows (a decoding step, a check of a few drafted tokens): an output's 16 codes at a time are
 * unpacked, converted and dequantized in registers (w = s·q + b) and multiplied into up to 8 rows,
 * in tiles of outputs × rows sized so that the accumulators hide the multiply-add latency and
 * stay in AVX2's 16 registers. Each code byte is read and unpacked once for up to 8 rows.
 * Many rows (prefill): on int8 activations, GEMM_OUT outputs' codes laid out side by side in a
 * small tile that stays in cache, multiplied 32 bytes an instruction (gemm_part); on fp32 ones, a
 * block of PANEL outputs dequantized into a small fp32 panel, multiplied 6 rows at a time.
 * With AVX-512 VNNI, weights are laid out at load as those tiles read them (quant_tile_pack, and
 * quant_q6k_tile_pack for Q6_K blocks) and every row count goes through the tiles (the end of this
 * file): a check then costs little more than a step.
 * AVX2 intrinsics on x86 (GCC/Clang vector extensions elsewhere), compiled on first use for this
 * machine and checked against a float64 product before any model uses it. Threads: one pool for
 * the process (run_parts) splits the outputs; each output is computed by one thread in a fixed
 * order, so any thread count gives the same bits.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 8        /* floats a vector holds */
#define ROW_GROUP 8    /* rows sharing one unpack of the codes (fp32 path; int8: I8_GROUP) */
#define PANEL 16       /* outputs a dequantized tile holds (many-row path) */
/* How far ahead of its reads a product asks for the codes it reads next. A step streams ~1.2 GB
 * of codes in rows of a few hundred bytes to a few KB, too short for the hardware's prefetcher to
 * run ahead of on its own: asked for, the Qwen 1.5B's 197 products of a step took 45.1 ms cold
 * instead of 51.5 (1 KB ahead 47.2, 4 KB 46.3), the 4-bit down projections 9.2 -> 7.6 ms. */
#define PREFETCH_BYTES 2048
/* The Q6_K tiles' codes, further: a block's codes are 1.5x a 4-bit block's bytes and more work, and
 * on an AMD EPYC (Zen 4) the output head at one row took 7.9 -> 6.8 ms (medians of 21, 2 threads;
 * 8 KB ahead 7.3, 32 KB 8.8), its down projections 0.63 -> 0.56 ms; the 4-bit tiles gained
 * nothing from 8 KB. */
#define Q6K_PREFETCH_BYTES 16384
static inline void prefetch(const void *p) { __builtin_prefetch(p, 0, 3); }

#if defined(__AVX2__) && defined(__FMA__)
/* x86 with AVX2: intrinsics, since GCC scalarizes a byte → int vector conversion and does not
 * contract vector-extension multiply-adds. */
#include <immintrin.h>
typedef __m256 vf;
typedef __m256i vi;
static inline vf zero(void) { return _mm256_setzero_ps(); }
static inline vf splat(float x) { return _mm256_set1_ps(x); }
static inline vf loadf(const float *p) { return _mm256_loadu_ps(p); }
static inline void storef(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vi load_codes(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline vi low4(vi v) { return _mm256_and_si256(v, _mm256_set1_epi32(15)); }
static inline vi high4(vi v) { return _mm256_srli_epi32(v, 4); }
static inline vf to_float(vi v) { return _mm256_cvtepi32_ps(v); }
static inline float hsum(vf v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#else
/* Elsewhere: GCC/Clang vector extensions (correct everywhere; slower where not contracted). */
typedef float vf __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(LANES * sizeof(int32_t))));
typedef uint8_t vb __attribute__((vector_size(LANES)));
static inline vf zero(void) { return (vf){0}; }
static inline vf splat(float x) { return (vf){0} + x; }
static inline vf loadf(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void storef(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf fmadd(vf a, vf b, vf c) { return a * b + c; }
static inline vi load_codes(const uint8_t *p) {
    vb v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, vi);
}
static inline vi low4(vi v) { return v & 15; }
static inline vi high4(vi v) { return v >> 4; }
static inline vf to_float(vi v) { return __builtin_convertvector(v, vf); }
static inline float hsum(vf v) {
    float s = 0.f;
    for (int k = 0; k < LANES; k++) s += v[k];
    return s;
}
#endif

/* ---- threads --------------------------------------------------------------------------------
 * One pool of workers for the process, whichever thread calls. Why not OpenMP: libgomp keeps a
 * team per calling thread, and once the process holds more of its threads than there are cores (a
 * server's engine thread calling after the main thread's checks: two teams on 2 cores) it stops
 * spinning between parallel regions, so each of a step's ~200 products waited for a woken
 * thread: the Qwen 1.5B's step took ~72 ms on a second thread against ~60 on the first. Here a
 * worker spins a while (SPINS pauses, ~1-2 ms) after a product before it sleeps, as libgomp does
 * in a single team, and a product's caller computes part 0 itself. The tiles' products (every
 * decoding pass and prefill of a tiled model) do not split their tiles in halves: each thread takes
 * an eighth of a half at a time from a counter they share (next_items), so a worker that woke late
 * or ran slower takes fewer. With halves the Qwen 1.5B's caller waited 4-8 ms of a ~60 ms step for
 * the worker (timed in an instrumented build); the step 61.2 -> 56.5 ms, a 4-row check 80.4 ->
 * 69.9, 8 rows 111.1 -> 104.1 (bench_layers.py steps --sources, the two builds interleaved). Which
 * thread computes a tile changes no bit. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void relax(void) { _mm_pause(); }
#else
static inline void relax(void) {}
#endif

#define MAX_PARTS 64
#define SPINS 100000

typedef void (*part_fn)(const void *args, long part, long parts);

static struct {
    pthread_mutex_t call;  /* one product at a time */
    pthread_mutex_t lock;  /* with `wake`: a sleeping worker's */
    pthread_cond_t wake;
    int workers;           /* started (parts 1..workers) */
    atomic_ulong generation; /* bumped once a product, after fn/args/parts are set */
    atomic_int pending;    /* workers not yet done with this product */
    part_fn fn;
    const void *args;
    long parts;
} pool = {.call = PTHREAD_MUTEX_INITIALIZER, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};
static unsigned long first_generation[MAX_PARTS];
static pthread_once_t fork_handler_once = PTHREAD_ONCE_INIT;

static void *pool_worker(void *arg) {
    long me = (long)arg;
    unsigned long seen = first_generation[me];
    for (;;) {
        unsigned long now;
        long spins = 0;
        while ((now = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen) {
            if (++spins < SPINS) {
                relax();
                continue;
            }
            pthread_mutex_lock(&pool.lock);
            while ((now = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen)
                pthread_cond_wait(&pool.wake, &pool.lock);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = now;
        if (me < pool.parts) pool.fn(pool.args, me, pool.parts);
        atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_release);
    }
    return NULL;
}

/* A forked child has none of the parent's workers: it starts its own. */
static void pool_after_fork(void) {
    pthread_mutex_init(&pool.call, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pool.workers = 0;
}
static void pool_register_fork(void) { pthread_atfork(NULL, NULL, pool_after_fork); }

/* fn(args, part, parts) for part 0..parts-1, part 0 on the calling thread; returns when all are
 * done. Fewer parts where workers cannot be started. Returns the parts run. */
static long run_parts(part_fn fn, const void *args, long parts) {
    if (parts > MAX_PARTS) parts = MAX_PARTS;
    if (parts <= 1) {
        fn(args, 0, 1);
        return 1;
    }
    pthread_once(&fork_handler_once, pool_register_fork);
    pthread_mutex_lock(&pool.call);
    unsigned long generation = atomic_load_explicit(&pool.generation, memory_order_relaxed);
    while (pool.workers < parts - 1) {
        pthread_t thread;
        pthread_attr_t attr;
        long me = pool.workers + 1;
        first_generation[me] = generation;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attr, pool_worker, (void *)me);
        pthread_attr_destroy(&attr);
        if (failed) break;
        pool.workers++;
    }
    if (parts > pool.workers + 1) parts = pool.workers + 1;
    pool.fn = fn;
    pool.args = args;
    pool.parts = parts;
    atomic_store_explicit(&pool.pending, pool.workers, memory_order_relaxed);
    pthread_mutex_lock(&pool.lock); /* a worker going to sleep sees the bump or gets the broadcast */
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    fn(args, 0, parts);
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) relax();
    pthread_mutex_unlock(&pool.call);
    return parts;
}

/* Items a thread takes at a time where the parts share items as they go (next_items): an eighth of
 * each part's share, so a thread that started late or runs slower takes fewer. */
static inline long share_chunk(long count, long parts) {
    long chunk = count / (8 * parts);
    return chunk > 0 ? chunk : 1;
}

/* The next `chunk` items of count from a counter all parts share: [*first, *end), or 0 when none is left. */
static inline int next_items(atomic_long *next, long count, long chunk, long *first, long *end) {
    *first = atomic_fetch_add_explicit(next, chunk, memory_order_relaxed);
    if (*first >= count) return 0;
    *end = *first + chunk < count ? *first + chunk : count;
    return 1;
}

/* Part `part` of `parts` of the items 0..count-1: contiguous, in order. */
static inline void part_range(long count, long part, long parts, long *first, long *end) {
    *first = count * part / parts;
    *end = count * (part + 1) / parts;
}

/* How scales and biases are stored (quant_cpu.py's SCALE_TYPES). */
enum { SCALE_F32 = 0, SCALE_F16 = 1, SCALE_BF16 = 2 };
/* Not a scale type but a layout: a weight of GGUF Q4_K blocks laid out as tiles (quant_q4k_tile_pack),
 * whose scales live in its tiles; taken by the tiles' call only (quant_tiled_rows). */
enum { SCALE_Q4K = 3 };

static inline float half_to_float(uint16_t h) {
#if defined(__F16C__) && defined(__AVX2__) && defined(__FMA__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 31u, mantissa = h & 0x3ffu, u;
    if (exponent == 0) { /* zero or subnormal: mantissa · 2^-24, exact in fp32 */
        float f = (float)mantissa * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    u = sign | (exponent == 31 ? 0x7f800000u : (exponent + 112u) << 23) | (mantissa << 13);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* Element i of a scale (or bias) array of the given type, as fp32 (exact: every fp16 and bf16
 * value is an fp32 value). */
static inline float scale_at(const void *p, long i, int type) {
    if (type == SCALE_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (type == SCALE_F16) return half_to_float(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Elements first..first+n-1 of a scale array as fp32: in place where they are fp32, else widened
 * into `buffer` (n floats), once for a row of codes, so the inner loops read fp32 either way. */
static inline const float *fp32_scales(const void *p, long first, long n, int type, float *buffer) {
    if (type == SCALE_F32) return (const float *)p + first;
    long i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const uint16_t *h = (const uint16_t *)p + first;
    for (; i + 8 <= n; i += 8) {
        __m128i bits = _mm_loadu_si128((const __m128i *)(h + i));
#if defined(__F16C__)
        __m256 wide = type == SCALE_F16 ? _mm256_cvtph_ps(bits)
                                        : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
        _mm256_storeu_ps(buffer + i, wide);
#else
        if (type == SCALE_F16) break;
        _mm256_storeu_ps(buffer + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16)));
#endif
    }
#endif
    for (; i < n; i++) buffer[i] = scale_at(p, first + i, type);
    return buffer;
}

/* Bytes an element of a scale array of this type takes. */
static inline long scale_size(int type) { return type == SCALE_F32 ? 4 : 2; }

/* x's columns in the order a 4-bit row's bytes give them: per 16 inputs, the even ones (low
 * nibbles of 8 bytes), then the odd ones (high nibbles). */
static void split_nibble_order(const float *x, float *out, long rows, long n_in) {
    for (long r = 0; r < rows; r++)
        for (long c = 0; c < n_in; c += 16)
            for (int k = 0; k < 8; k++) {
                out[r * n_in + c + k] = x[r * n_in + c + 2 * k];
                out[r * n_in + c + 8 + k] = x[r * n_in + c + 2 * k + 1];
            }
}

/* The 16 weights of output row `codes` at inputs c..c+15, dequantized in registers (w = s·q + b),
 * in the order split_nibble_order (4-bit) or the natural order (8-bit) gives x. */
static inline void dequantize16(const uint8_t *codes, long c, int bits, vf s, vf b, vf *w0, vf *w1) {
    if (bits == 4) {
        vi packed = load_codes(codes + c / 2);
        *w0 = fmadd(to_float(low4(packed)), s, b);
        *w1 = fmadd(to_float(high4(packed)), s, b);
    } else {
        *w0 = fmadd(to_float(load_codes(codes + c)), s, b);
        *w1 = fmadd(to_float(load_codes(codes + c + 8)), s, b);
    }
}

/* An O × K tile: outputs o..o+O-1 times K rows (compile-time counts, so the O·K accumulators
 * stay in registers). Each output's codes are dequantized once in registers for the K rows;
 * O·K independent accumulators keep the multiply-adds from waiting on each other. */
#define TILE(O, K, S)                                                                            \
    static void tile_##O##x##K(const float *xs, const uint8_t *w, const void *scales,           \
                               const void *biases, float *y, long n_in, long n_out, long gs,    \
                               int bits, int type) {                                             \
        long groups = n_in / gs, row_bytes = n_in * bits / 8;                                    \
        float widened[2][O][groups];                                                             \
        const float *sc[O], *bi[O];                                                              \
        for (int o = 0; o < O; o++) {                                                            \
            sc[o] = fp32_scales(scales, o * groups, groups, type, widened[0][o]);                \
            bi[o] = fp32_scales(biases, o * groups, groups, type, widened[1][o]);                \
        }                                                                                        \
        vf acc[O][K][S];                                                                         \
        for (int o = 0; o < O; o++)                                                              \
            for (int r = 0; r < K; r++)                                                          \
                for (int h = 0; h < S; h++) acc[o][r][h] = zero();                               \
        /* the next tile's codes, scales and biases, asked for as far along as this one is read */ \
        long scale_bytes = scale_size(type), group_bytes = O * gs * bits / 8;                    \
        const char *next_codes = (const char *)w + O * row_bytes;                                \
        const char *next_scales = (const char *)scales + O * groups * scale_bytes;               \
        const char *next_biases = (const char *)biases + O * groups * scale_bytes;               \
        for (long g = 0; g < groups; g++) {                                                      \
            for (long line = 0; line < group_bytes; line += 64) prefetch(next_codes + g * group_bytes + line); \
            prefetch(next_scales + g * O * scale_bytes);                                         \
            prefetch(next_biases + g * O * scale_bytes);                                         \
            for (long c = g * gs; c < (g + 1) * gs; c += 16) {                                   \
                for (int o = 0; o < O; o++) {                                                    \
                    vf w0, w1;                                                                   \
                    dequantize16(w + o * row_bytes, c, bits, splat(sc[o][g]), splat(bi[o][g]),   \
                                 &w0, &w1);                                                      \
                    for (int r = 0; r < K; r++) {                                                \
                        acc[o][r][0] = fmadd(w0, loadf(xs + r * n_in + c), acc[o][r][0]);        \
                        acc[o][r][S - 1] = fmadd(w1, loadf(xs + r * n_in + c + 8), acc[o][r][S - 1]); \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int o = 0; o < O; o++)                                                              \
            for (int r = 0; r < K; r++) {                                                        \
                vf sum = acc[o][r][0];                                                           \
                for (int h = 1; h < S; h++) sum = sum + acc[o][r][h];                            \
                y[r * n_out + o] = hsum(sum);                                                    \
            }                                                                                    \
    }

/* O·K accumulators, one an output and row (S = 1): enough to hide the multiply-add latency, few
 * enough to stay in AVX2's 16 registers, and each output of a row summed in the same order by
 * every tile, so a row's result does not depend on how many rows share its product (a check's
 * rows are a step's, bit for bit). Two a row (S = 2) was not faster at 2-4 rows. */
TILE(4, 1, 1)
TILE(2, 2, 1)
TILE(1, 3, 1)
TILE(1, 4, 1)
TILE(1, 5, 1)
TILE(1, 6, 1)
TILE(1, 7, 1)
TILE(1, 8, 1)
TILE(1, 1, 1)
TILE(1, 2, 1)

typedef void (*tile_fn)(const float *, const uint8_t *, const void *, const void *, float *, long,
                        long, long, int, int);
/* Up to 8 rows share one unpack of each output's codes: a check of 7 drafted tokens reads and
 * unpacks the weights once, as a step does (5-8 rows keep one accumulator a row: 8 of 16
 * registers). */
static const tile_fn WIDE[ROW_GROUP + 1] = {0,        tile_4x1, tile_2x2, tile_1x3, tile_1x4,
                                            tile_1x5, tile_1x6, tile_1x7, tile_1x8};
static const int WIDTH[ROW_GROUP + 1] = {0, 4, 2, 1, 1, 1, 1, 1, 1};
static const tile_fn NARROW[ROW_GROUP + 1] = {0,        tile_1x1, tile_1x2, tile_1x3, tile_1x4,
                                              tile_1x5, tile_1x6, tile_1x7, tile_1x8};

/* Outputs o0..o0+width of W dequantized into `tile` (width rows of n_in floats, in the order the
 * codes unpack in: x in the same order multiplies it), 16 weights at a time in registers. */
static void dequantize_tile(const uint8_t *w, const void *scales, const void *biases, float *tile,
                            long o0, long width, long n_in, long gs, int bits, int type) {
    long groups = n_in / gs, row_bytes = n_in * bits / 8;
    for (long j = 0; j < width; j++) {
        const uint8_t *codes = w + (o0 + j) * row_bytes;
        float widened[2][groups];
        const float *s = fp32_scales(scales, (o0 + j) * groups, groups, type, widened[0]);
        const float *b = fp32_scales(biases, (o0 + j) * groups, groups, type, widened[1]);
        float *out = tile + j * n_in;
        for (long c = 0; c < n_in; c += 16) {
            vf w0, w1;
            dequantize16(codes, c, bits, splat(s[c / gs]), splat(b[c / gs]), &w0, &w1);
            storef(out + c, w0);
            storef(out + c + 8, w1);
        }
    }
}

/* ---- GGUF's Q6_K blocks, read as they are stored -------------------------------------------
 * A row of n_in weights is n_in/256 blocks of Q6K_BYTES: ql[128] (each code's low 4 bits), qh[64]
 * (its high 2), 16 int8 scales (one per 16 weights) and d (fp16): w = d·scale·(q - 32), q in
 * 0..63, 6.5625 bits a weight. Values in ggml's order: per half n of 128 (ql + 64n, qh + 32n,
 * scales + 8n), l in 0..31: value l is ql[l]'s low nibble with qh[l]'s bits 0-1, l + 32 ql[l + 32]'s
 * low with bits 2-3, l + 64 ql[l]'s high with bits 4-5, l + 96 ql[l + 32]'s high with bits 6-7;
 * value v's scale is scales[8n + v / 16]. (MLX has no group of 16, so such a weight cannot be an
 * MLX affine one without re-rounding it: kernels/quant_weights.py's Q6K layout.) */
#define Q6K_VALUES 256
#define Q6K_BYTES 210

static inline float q6k_d(const uint8_t *block) {
    return half_to_float((uint16_t)(block[208] | (block[209] << 8)));
}

/* Output rows o0..o0+width-1 of a Q6_K weight as fp32 in the values' natural order, each weight
 * computed as ggml computes it: (d·scale)·(q - 32). */
static void q6k_dequantize_tile(const uint8_t *w, float *tile, long o0, long width, long n_in) {
    long blocks = n_in / Q6K_VALUES;
    for (long j = 0; j < width; j++) {
        const uint8_t *block = w + (o0 + j) * blocks * Q6K_BYTES;
        float *out = tile + j * n_in;
        for (long b = 0; b < blocks; b++, block += Q6K_BYTES, out += Q6K_VALUES) {
            float d = q6k_d(block);
            for (int n = 0; n < 2; n++) {
                const uint8_t *ql = block + 64 * n, *qh = block + 128 + 32 * n;
                const int8_t *sc = (const int8_t *)(block + 192) + 8 * n;
                float *o = out + 128 * n;
                for (int l = 0; l < 32; l++) {
                    o[l] = d * sc[l / 16] * (float)(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
                    o[l + 32] = d * sc[l / 16 + 2] * (float)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    o[l + 64] = d * sc[l / 16 + 4] * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    o[l + 96] = d * sc[l / 16 + 6] * (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
        }
    }
}

/* The tile's PANEL outputs as a panel (n_in × PANEL: input i's PANEL weights contiguous), an
 * 8 × 8 block at a time; rows past `width` are zero. */
static void tile_to_panel(float *tile, float *panel, long width, long n_in) {
    if (width < PANEL) memset(tile + width * n_in, 0, sizeof(float) * (PANEL - width) * n_in);
    for (long j0 = 0; j0 < PANEL; j0 += 8)
        for (long i0 = 0; i0 < n_in; i0 += 8) {
#if defined(__AVX2__) && defined(__FMA__)
            __m256 r[8], t[8];
            for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(tile + (j0 + k) * n_in + i0);
            for (int k = 0; k < 8; k += 2) {
                t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
                t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
            }
            for (int k = 0; k < 8; k += 4) {
                r[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
                r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
                r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
                r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
            }
            /* r[0..3]: columns 0,1,2,3 of rows 0-3 | 4-7 halves; pair the 128-bit halves */
            static const int order[8] = {0, 1, 2, 3, 0, 1, 2, 3};
            for (int k = 0; k < 4; k++) {
                __m256 lo = _mm256_permute2f128_ps(r[order[k]], r[4 + order[k]], 0x20);
                __m256 hi = _mm256_permute2f128_ps(r[order[k]], r[4 + order[k]], 0x31);
                _mm256_storeu_ps(panel + (i0 + k) * PANEL + j0, lo);
                _mm256_storeu_ps(panel + (i0 + 4 + k) * PANEL + j0, hi);
            }
#else
            for (int k = 0; k < 8; k++)
                for (int i = 0; i < 8; i++)
                    panel[(i0 + i) * PANEL + j0 + k] = tile[(j0 + k) * n_in + i0 + i];
#endif
        }
}

#define PVECS (PANEL / LANES)
/* K rows (x in the panel's input order) times one panel: K·PVECS accumulators, each weight of
 * the panel read once for the K rows. */
#define PANEL_TIMES(K)                                                                           \
    static void panel_rows_##K(const float *x, const float *panel, float *y, long n_in,         \
                               long n_out) {                                                     \
        vf acc[K][PVECS];                                                                        \
        for (int r = 0; r < K; r++)                                                              \
            for (int v = 0; v < PVECS; v++) acc[r][v] = zero();                                  \
        const float *p = panel;                                                                  \
        for (long i = 0; i < n_in; i++, p += PANEL) {                                            \
            vf col[PVECS];                                                                       \
            for (int v = 0; v < PVECS; v++) col[v] = loadf(p + v * LANES);                       \
            for (int r = 0; r < K; r++) {                                                        \
                vf xi = splat(x[r * n_in + i]);                                                  \
                for (int v = 0; v < PVECS; v++) acc[r][v] = fmadd(xi, col[v], acc[r][v]);        \
            }                                                                                    \
        }                                                                                        \
        for (int r = 0; r < K; r++)                                                              \
            for (int v = 0; v < PVECS; v++) storef(y + r * n_out + v * LANES, acc[r][v]);        \
    }

#define PANEL_ROWS 6 /* rows multiplied per read of a panel: 12 accumulators in registers */
PANEL_TIMES(1)
PANEL_TIMES(2)
PANEL_TIMES(3)
PANEL_TIMES(4)
PANEL_TIMES(5)
PANEL_TIMES(6)

typedef void (*panel_fn)(const float *, const float *, float *, long, long);
static const panel_fn PANEL_FN[PANEL_ROWS + 1] = {0,           panel_rows_1, panel_rows_2,
                                                  panel_rows_3, panel_rows_4, panel_rows_5,
                                                  panel_rows_6};

/* The many-row path: each thread dequantizes PANEL outputs at a time (in registers, into a
 * tile), lays them out as a panel that stays in cache, and multiplies every row on it. */
struct many_args {
    const float *xs;
    const uint8_t *w;
    const void *scales, *biases;
    float *y;
    long rows, n_in, n_out, gs;
    int bits, type;
    int q6k; /* w is Q6_K blocks (scales, biases, gs and bits unused) */
    atomic_int failed;
};

static void many_part(const void *p, long part, long parts) {
    struct many_args *a = (struct many_args *)p;
    long first, end;
    part_range((a->n_out + PANEL - 1) / PANEL, part, parts, &first, &end);
    float *tile = malloc(sizeof(float) * a->n_in * PANEL);
    float *panel = malloc(sizeof(float) * a->n_in * PANEL);
    float out[PANEL_ROWS * PANEL];
    if (!tile || !panel) atomic_store(&a->failed, 1);
    for (long blk = first; blk < end && tile && panel; blk++) {
        long o0 = blk * PANEL, width = a->n_out - o0 < PANEL ? a->n_out - o0 : PANEL;
        if (a->q6k)
            q6k_dequantize_tile(a->w, tile, o0, width, a->n_in);
        else
            dequantize_tile(a->w, a->scales, a->biases, tile, o0, width, a->n_in, a->gs, a->bits, a->type);
        tile_to_panel(tile, panel, width, a->n_in);
        for (long r = 0; r < a->rows; r += PANEL_ROWS) {
            long k = a->rows - r < PANEL_ROWS ? a->rows - r : PANEL_ROWS;
            PANEL_FN[k](a->xs + r * a->n_in, panel, out, a->n_in, PANEL);
            for (long rr = 0; rr < k; rr++)
                memcpy(a->y + (r + rr) * a->n_out + o0, out + rr * PANEL, sizeof(float) * width);
        }
    }
    free(tile);
    free(panel);
}

static int many_rows(const float *xs, const uint8_t *w, const void *scales, const void *biases,
                     float *y, long rows, long n_in, long n_out, long gs, int bits, int type,
                     int threads) {
    struct many_args args = {xs, w, scales, biases, y, rows, n_in, n_out, gs, bits, type, 0, 0};
    run_parts(many_part, &args, threads);
    return atomic_load(&args.failed) ? -1 : 0;
}

/* The few-row schedule both paths share: threads split the outputs in tiles of width[rows]
 * outputs; a tile's rows go ROW_GROUP at a time, through a full tile where its width fits that
 * group's row count, else one output at a time. `step(args, wide, k, r, o)` computes outputs
 * from o for rows r..r+k, a full tile (wide) or one output. */
typedef void (*tile_step)(const void *args, int wide, long k, long r, long o);

struct tile_args {
    const int *width;
    long group, rows, n_out;
    tile_step step;
    const void *args;
};

static void tile_part(const void *p, long part, long parts) {
    const struct tile_args *a = p;
    long span = a->width[a->rows < a->group ? a->rows : a->group], tiles = a->n_out / span;
    long first, end;
    part_range(tiles + 1, part, parts, &first, &end);
    for (long t = first; t < end; t++) {
        long o = t * span, count = t < tiles ? span : a->n_out - tiles * span;
        for (long r = 0; r < a->rows; r += a->group) {
            long k = a->rows - r < a->group ? a->rows - r : a->group;
            for (long done = 0; done < count;) {
                int wide = count - done >= a->width[k];
                a->step(a->args, wide, k, r, o + done);
                done += wide ? a->width[k] : 1;
            }
        }
    }
}

static int for_each_tile(const int *width, long group, long rows, long n_out, int threads,
                         tile_step step, const void *args) {
    struct tile_args all = {width, group, rows, n_out, step, args};
    return (int)run_parts(tile_part, &all, threads);
}

struct few_args {
    const float *xs;
    const uint8_t *w;
    const void *scales, *biases;
    float *y;
    long n_in, n_out, gs, groups, row_bytes;
    int bits, type;
};

static void few_step(const void *args, int wide, long k, long r, long o) {
    const struct few_args *a = args;
    long first = o * a->groups * scale_size(a->type); /* bytes to output o's first scale */
    (wide ? WIDE[k] : NARROW[k])(a->xs + r * a->n_in, a->w + o * a->row_bytes,
                                 (const char *)a->scales + first, (const char *)a->biases + first,
                                 a->y + r * a->n_out + o, a->n_in, a->n_out, a->gs, a->bits, a->type);
}

/* y (rows × n_out) = x (rows × n_in) · Wᵀ for bits 4 or 8 (codes one a byte), group size `gs`
 * (a multiple of 16 dividing n_in), scales and biases of `type`. From `many_from` rows on, the
 * dequantized-panel path. Returns the threads used, or -1 on a bad argument or no memory. */
int quant_rows(const float *x, const void *codes, const void *scales, const void *biases, float *y,
               long rows, long n_in, long n_out, long gs, int bits, int threads, long many_from,
               int type) {
    const uint8_t *w = codes;
    if (!biases || (bits != 4 && bits != 8) || gs < 16 || gs % 16 || n_in % gs || rows < 1 ||
        type < SCALE_F32 || type > SCALE_BF16)
        return -1;
    if (threads < 1) threads = 1;
    long groups = n_in / gs;
    float *xs = malloc(sizeof(float) * rows * n_in);
    if (!xs) return -1;
    if (bits == 4)
        split_nibble_order(x, xs, rows, n_in);
    else
        memcpy(xs, x, sizeof(float) * rows * n_in);
    long row_bytes = n_in * bits / 8;
    if (rows >= many_from) {
        int failed = many_rows(xs, w, scales, biases, y, rows, n_in, n_out, gs, bits, type, threads);
        free(xs);
        return failed ? -1 : threads;
    }
    struct few_args args = {xs, w, scales, biases, y, n_in, n_out, gs, groups, row_bytes, bits, type};
    threads = for_each_tile(WIDTH, ROW_GROUP, rows, n_out, threads, few_step, &args);
    free(xs);
    return threads;
}

/* MLX's packed `bits`-bit codes (rows × n_in, each row a little-endian bit stream of whole
 * 32-bit words: value i at bits i·bits…) as one byte a code (the kernel's 8-bit layout). 6-bit
 * codes, the common case (GGUF's Q6_K), go 4 at a time from 3 bytes; other widths bit by bit.
 * Returns 0, or -1 on a bad width. */
struct unpack_args {
    const uint8_t *packed;
    uint8_t *out;
    long rows, n_in;
    int bits;
};

static void unpack_part(const void *p, long part, long parts) {
    const struct unpack_args *a = p;
    long first, end, row_bytes = a->n_in * a->bits / 8, n_in = a->n_in;
    int bits = a->bits;
    unsigned mask = (1u << bits) - 1u;
    part_range(a->rows, part, parts, &first, &end);
    for (long r = first; r < end; r++) {
        const uint8_t *p = a->packed + r * row_bytes;
        uint8_t *o = a->out + r * n_in;
        if (bits == 6) {
            for (long i = 0; i < n_in; i += 4, p += 3, o += 4) {
                o[0] = p[0] & 63;
                o[1] = (uint8_t)((p[0] >> 6) | ((p[1] & 15) << 2));
                o[2] = (uint8_t)((p[1] >> 4) | ((p[2] & 3) << 4));
                o[3] = p[2] >> 2;
            }
            continue;
        }
        uint32_t acc = 0;
        int have = 0;
        for (long i = 0; i < n_in; i++) {
            if (have < bits) {
                acc |= (uint32_t)(*p++) << have;
                have += 8;
            }
            o[i] = (uint8_t)(acc & mask);
            acc >>= bits;
            have -= bits;
        }
    }
}

int quant_unpack(const uint8_t *packed, uint8_t *out, long rows, long n_in, int bits, int threads) {
    if (bits < 1 || bits > 8 || (n_in * bits) % 32) return -1;
    struct unpack_args args = {packed, out, rows, n_in, bits};
    run_parts(unpack_part, &args, threads > 1 && rows > 64 ? threads : 1);
    return 0;
}

/* Whether this build runs products on more than one thread. */
int quant_threaded(void) { return 1; }

/* fn(args, part, parts) on the products' threads (part 0 on the caller), for another library's work
 * between products: pass_ops.c's attention, given this as a function pointer (it does not link this
 * library), so a pass keeps one pool of threads. Returns the parts run. */
long quant_run_parts(part_fn fn, const void *args, long parts) { return run_parts(fn, args, parts); }

/* ---- int8 activations (not exact: x is rounded) ---------------------------------------------
 * As llama.cpp multiplies its 4-bit blocks: each row of x is rounded to int8 per block of 32
 * inputs with one fp32 step dx (x ≈ dx·xq), the codes are centred at 8 and a block's
 * Σ (q - 8)·xq = Σ q·xq - 8·Σ xq is summed exactly in integers (u8 × s8 pairs, then pairs of
 * int16), and the output is
 *   y[r, o] = Σ_blocks s[o, g]·dx[r, blk]·Σ_blk (q - 8)·xq  +  Σ_g (b[o, g] + 8·s[o, g])·Σ_g x[r, i]
 * with the bias term on the exact group sums of x. Centring halves the codes' reach, and with it
 * the error x's rounding brings. Eight blocks' integer sums are reduced in one horizontal tree and
 * scaled by one vector multiply, so a weight costs about a third of the fp32 path's instructions.
 * Codes held a byte each are centred at their own midpoint (`centre`: log2 of it): 5- and 6-bit
 * codes (below 128) are one u8 × s8 product as 4-bit ones are; full 8-bit codes are centred in
 * registers and multiplied as |w| × x·sign(w), so no pair of products can saturate int16.
 * Groups a multiple of 32, fewer than `many_from` rows; anything else goes the fp32 way. Which
 * layers take it (not a down projection, whose inputs carry activations hundreds of times their
 * median, which int8 blocks lose: those take int16, below) is kernels/quant_cpu.py's choice. */
#if defined(__AVX2__) && defined(__FMA__)
#define BLOCK 32   /* inputs sharing one activation step */
#define TREE 8     /* blocks reduced and scaled together */
#define I8_GROUP 4 /* rows sharing one unpack of the codes on the int8 path */

struct i8_args {
    const int8_t *xq;
    const int16_t *xw; /* x's rows as int16 instead (wide): xq is then unused */
    const float *dx, *xsum;
    const int32_t *xqsum; /* Σ xq per block (padded like dx) */
    const uint8_t *w;
    const void *scales, *biases;
    float *y;
    long y_stride; /* floats a row of y takes: n_out, or more where y holds several weights' outputs */
    long n_in, n_out, gs, groups, blocks, padded;
    long stride; /* bytes a row of xq takes: n_in, or for 4-bit codes n_in rounded up to 64 */
    int bits, centre, type; /* the codes' container (4 or 8), log2 of their centre, scale type */
    int wide;               /* x rounded to int16 (32767 steps a block) rather than int8 */
};

/* acc + u · s by groups of 4 bytes (u unsigned, s signed): int32 lane i adds bytes 4i..4i+3's
 * products. One VNNI instruction where the CPU has it; else u8 × s8 pairs summed to int16, then
 * pairs of those to int32 (the same integers: a pair's sum cannot saturate int16 for the codes
 * the callers pass, below 128 against |x| ≤ 127, or |w| ≤ 128 with x's sign moved onto it). */
static inline __m256i dot_bytes(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* Σ over a block of codes × x (8 int32 partial sums; codes below 128, a byte each). */
static inline __m256i block_dot(__m256i q, const int8_t *xq, long blk) {
    __m256i x = _mm256_loadu_si256((const __m256i *)(xq + blk * BLOCK));
    return dot_bytes(_mm256_setzero_si256(), q, x);
}

/* Block `blk`'s 32 full-byte codes centred at 128, as s8: q - 128 is q with its top bit flipped. */
static inline __m256i centred_codes(const uint8_t *codes, long blk) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(codes + blk * BLOCK));
    return _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
}

/* Σ over a block of centred codes w × x (8 int32 partial sums) as one u8 × s8 product: |w| times
 * x with w's sign. |w| ≤ 128 and |x| ≤ 127, so a pair's sum (≤ 32512) cannot saturate int16. */
static inline __m256i signed_dot(__m256i size, __m256i w, const int8_t *xq, long blk) {
    __m256i x = _mm256_loadu_si256((const __m256i *)(xq + blk * BLOCK));
    return dot_bytes(_mm256_setzero_si256(), size, _mm256_sign_epi8(x, w));
}

/* Elements i..i+7 (n = 8) or i..i+3 (n = 4, the upper lanes then 0) of a scale array of `type`,
 * widened to fp32. */
static inline __m256 load_scales(const void *p, long i, int type, int n) {
    if (type == SCALE_F32) {
        const float *f = (const float *)p + i;
        return n == 8 ? _mm256_loadu_ps(f) : _mm256_castps128_ps256(_mm_loadu_ps(f));
    }
    const uint16_t *h = (const uint16_t *)p + i;
    __m128i bits = n == 8 ? _mm_loadu_si128((const __m128i *)h) : _mm_loadl_epi64((const __m128i *)h);
    if (type == SCALE_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
#if defined(__F16C__)
    return _mm256_cvtph_ps(bits);
#else
    float lanes[8] = {0};
    for (int k = 0; k < n; k++) lanes[k] = half_to_float(h[k]);
    return _mm256_loadu_ps(lanes);
#endif
}

/* 4-bit codes, two blocks at once: blocks blk and blk + 1 (blk even) are 32 bytes, whose low
 * nibbles are the even inputs of each and the high nibbles the odd ones. x is laid out to match
 * (quantize_rows): per 64 inputs, block blk's even inputs, blk + 1's, then their odd ones, so one
 * load of codes and two nibble masks give 64 codes, and the two products are summed by groups of
 * 4 bytes into int32 lanes (dot_bytes; in int16 first without VNNI: a lane's sum is at most
 * 2·2·15·127 = 7620). Lanes 0-3 of the result
 * are block blk's partial sums, lanes 4-7 blk + 1's (zeros past the row's last block). */
static inline __m256i nibble_pair_codes(const uint8_t *codes, long blk, long blocks, __m256i *high) {
    __m256i v = blk + 1 < blocks ? _mm256_loadu_si256((const __m256i *)(codes + blk * 16))
                                 : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(codes + blk * 16)));
    const __m256i mask = _mm256_set1_epi8(15);
    *high = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    return _mm256_and_si256(v, mask);
}

static inline __m256i nibble_pair_dot(__m256i low, __m256i high, const int8_t *xq, long blk) {
    __m256i even = _mm256_loadu_si256((const __m256i *)(xq + blk * BLOCK));
    __m256i odd = _mm256_loadu_si256((const __m256i *)(xq + blk * BLOCK + BLOCK));
    return dot_bytes(dot_bytes(_mm256_setzero_si256(), low, even), high, odd);
}

/* The scales of blocks b0..b0+7 of the row whose first scale is element `first` (0 past the
 * row's last block). */
static inline __m256 block_scales(const void *s, long first, long b0, long blocks, long gs, int type) {
    if (b0 + TREE <= blocks) {
        if (gs == BLOCK) return load_scales(s, first + b0, type, 8);
        if (gs == 2 * BLOCK)
            return _mm256_permutevar8x32_ps(load_scales(s, first + b0 / 2, type, 4),
                                            _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    }
    float lanes[TREE];
    for (int k = 0; k < TREE; k++) lanes[k] = b0 + k < blocks ? scale_at(s, first + (b0 + k) * BLOCK / gs, type) : 0.f;
    return _mm256_loadu_ps(lanes);
}

/* The bias term of output o and row r + k: Σ_g (b[o, g] + centre·s[o, g])·Σ_g x, in fp32. */
static inline float bias_term(const struct i8_args *a, long first, long row) {
    const float *xs = a->xsum + row * a->groups;
    const __m256 centre = _mm256_set1_ps((float)(1 << a->centre));
    __m256 bv = _mm256_setzero_ps();
    long g = 0;
    for (; g + 8 <= a->groups; g += 8) {
        __m256 bias = _mm256_fmadd_ps(load_scales(a->scales, first + g, a->type, 8), centre,
                                      load_scales(a->biases, first + g, a->type, 8));
        bv = _mm256_fmadd_ps(bias, _mm256_loadu_ps(xs + g), bv);
    }
    float bias = hsum(bv);
    for (; g < a->groups; g++)
        bias += (scale_at(a->biases, first + g, a->type) +
                 (float)(1 << a->centre) * scale_at(a->scales, first + g, a->type)) * xs[g];
    return bias;
}

/* acc plus row `row`'s 8 block sums of the tree at b0 (in block order), centred at the codes'
 * midpoint where `centre` (Σ (q - c)·xq = Σ q·xq - c·Σ xq), converted once and scaled by s·dx. */
static inline __m256 add_tree(__m256 acc, __m256i sums, __m256 scale, const struct i8_args *a, long row,
                              long b0, int centre) {
    __m256i xqs = _mm256_loadu_si256((const __m256i *)(a->xqsum + row * a->padded + b0));
    if (centre) sums = _mm256_sub_epi32(sums, _mm256_sll_epi32(xqs, _mm_cvtsi32_si128(a->centre)));
    __m256 step = _mm256_mul_ps(scale, _mm256_loadu_ps(a->dx + row * a->padded + b0));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), step, acc);
}

/* One output o of 4-bit codes times K rows from r: per 8 blocks, four pairs of blocks
 * (nibble_pair_dot), reduced in three horizontal adds to lanes [0, 2, 4, 6, 1, 3, 5, 7]'s block
 * sums, put in block order by one permute, centred, converted once and scaled by s·dx; the float
 * operations a row sees do not depend on K. */
#define I8NIBBLES(K)                                                                             \
    static void i8rows4_##K(const struct i8_args *a, long r, long o) {                          \
        const uint8_t *codes = a->w + o * (a->n_in / 2);                                        \
        long first = o * a->groups;                                                              \
        const int8_t *xq[K];                                                                     \
        for (int k = 0; k < K; k++) xq[k] = a->xq + (r + k) * a->stride;                        \
        __m256 acc[K];                                                                           \
        for (int k = 0; k < K; k++) acc[k] = _mm256_setzero_ps();                                \
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);                        \
        const char *scales = (const char *)a->scales + first * scale_size(a->type);              \
        const char *biases = (const char *)a->biases + first * scale_size(a->type);              \
        for (long b0 = 0; b0 < a->blocks; b0 += TREE) {                                          \
            /* outputs follow each other in memory: ahead of the last is the next output's */   \
            prefetch(codes + b0 * 16 + PREFETCH_BYTES);                                          \
            prefetch(codes + b0 * 16 + PREFETCH_BYTES + 64);                                     \
            long ahead = b0 * BLOCK / a->gs * scale_size(a->type) + PREFETCH_BYTES / 4;          \
            prefetch(scales + ahead);                                                            \
            prefetch(biases + ahead);                                                            \
            __m256i sums[K];                                                                     \
            if (NIBBLE_QUADS_ON && b0 + TREE <= a->blocks) {                                     \
                quad_tree(codes, b0, xq, K, sums);                                               \
            } else {                                                                             \
                __m256i pair[K][4];                                                              \
                for (int p = 0; p < 4; p++) {                                                    \
                    long blk = b0 + 2 * p;                                                       \
                    if (blk < a->blocks) {                                                       \
                        __m256i high, low = nibble_pair_codes(codes, blk, a->blocks, &high);     \
                        for (int k = 0; k < K; k++) pair[k][p] = nibble_pair_dot(low, high, xq[k], blk); \
                    } else {                                                                     \
                        for (int k = 0; k < K; k++) pair[k][p] = _mm256_setzero_si256();         \
                    }                                                                            \
                }                                                                                \
                for (int k = 0; k < K; k++)                                                      \
                    sums[k] = _mm256_permutevar8x32_epi32(                                       \
                        _mm256_hadd_epi32(_mm256_hadd_epi32(pair[k][0], pair[k][1]),             \
                                          _mm256_hadd_epi32(pair[k][2], pair[k][3])),            \
                        order);                                                                  \
            }                                                                                    \
            __m256 scale = block_scales(a->scales, first, b0, a->blocks, a->gs, a->type);        \
            for (int k = 0; k < K; k++) acc[k] = add_tree(acc[k], sums[k], scale, a, r + k, b0, 1); \
        }                                                                                        \
        for (int k = 0; k < K; k++) a->y[(r + k) * a->y_stride + o] = hsum(acc[k]) + bias_term(a, first, r + k); \
    }

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define NIBBLE_QUADS 1
/* The same products with AVX-512 on a whole tree: one load of 64 bytes is 4 blocks' codes (low
 * nibbles their even inputs, high nibbles their odd ones), x laid out to match (quantize_rows'
 * SPLIT_QUADS: per 128 inputs the 4 blocks' even inputs, then their odd ones), so a row's 8 blocks
 * take 4 byte products of 64 bytes where 256-bit vectors took 8 of 32; the two vectors' 4 lanes a
 * block are summed by unpacks and one shuffle, and put in block order by one permute. The same
 * integer block sums, then add_tree: the same bits. A tree past the row's last block (fewer than
 * 8 blocks) goes by pairs of blocks, x laid out in pairs there. */
static inline __m256i quad_tree_sums(__m512i a, __m512i b) {
    __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    s = _mm512_add_epi32(s, _mm512_shuffle_epi32(s, _MM_PERM_BADC));
    /* lane 4L: block L's sum (a's), lane 4L + 1: block 4 + L's (b's) */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, s));
}

/* The 8 block sums (in block order) of a whole tree at b0 for K rows. */
static inline void quad_tree(const uint8_t *codes, long b0, const int8_t *const *xq, int K, __m256i *sums) {
    const __m512i mask = _mm512_set1_epi8(15);
    __m512i low[2], high[2];
    for (int h = 0; h < 2; h++) {
        __m512i v = _mm512_loadu_si512((const void *)(codes + (b0 + 4 * h) * 16));
        low[h] = _mm512_and_si512(v, mask);
        high[h] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    }
    for (int k = 0; k < K; k++) {
        __m512i half[2];
        for (int h = 0; h < 2; h++) {
            const int8_t *x = xq[k] + (b0 + 4 * h) * BLOCK;
            half[h] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), low[h], _mm512_loadu_si512((const void *)x));
            half[h] = _mm512_dpbusd_epi32(half[h], high[h], _mm512_loadu_si512((const void *)(x + 64)));
        }
        sums[k] = quad_tree_sums(half[0], half[1]);
    }
}
#define NIBBLE_QUADS_ON 1
#else
#define NIBBLE_QUADS_ON 0
static inline void quad_tree(const uint8_t *codes, long b0, const int8_t *const *xq, int K, __m256i *sums) {
    (void)codes, (void)b0, (void)xq, (void)K, (void)sums; /* never called: NIBBLE_QUADS_ON is 0 */
}

#endif

/* One output o times K rows from r: per 8 blocks, each row's 8 integer block sums are reduced in
 * a horizontal tree to one vector (lane k: block k's sum), centred, converted once and scaled by
 * s·dx. The float operations a row sees do not depend on K, so a row's result does not either. */
/* BITS: 7 (a code a byte, below 128: one u8 × s8 product, as for 4-bit codes) or 8 (a full
 * byte, centred at 128 in registers: one u8 × s8 product of its size and x with its sign, as
 * llama.cpp multiplies its 8-bit blocks). */
#define I8ROWS(BITS, K)                                                                          \
    static void i8rows##BITS##_##K(const struct i8_args *a, long r, long o) {                   \
        const uint8_t *codes = a->w + o * a->n_in;                                               \
        long first = o * a->groups; /* output o's first scale and bias */                       \
        const int8_t *xq[K];                                                                     \
        for (int k = 0; k < K; k++) xq[k] = a->xq + (r + k) * a->stride;                        \
        __m256 acc[K];                                                                           \
        for (int k = 0; k < K; k++) acc[k] = _mm256_setzero_ps();                                \
        const char *scales = (const char *)a->scales + first * scale_size(a->type);              \
        const char *biases = (const char *)a->biases + first * scale_size(a->type);              \
        for (long b0 = 0; b0 < a->blocks; b0 += TREE) {                                          \
            for (int line = 0; line < 4; line++) prefetch(codes + b0 * BLOCK + PREFETCH_BYTES + 64 * line); \
            long ahead = b0 * BLOCK / a->gs * scale_size(a->type) + PREFETCH_BYTES / 8;          \
            prefetch(scales + ahead);                                                            \
            prefetch(biases + ahead);                                                            \
            __m256i half[K][2];                                                                  \
            for (int quad = 0; quad < 2; quad++) {                                               \
                __m256i pair[K][2];                                                              \
                for (int p = 0; p < 2; p++) {                                                    \
                    __m256i dot[K][2];                                                           \
                    for (int h = 0; h < 2; h++) {                                                \
                        long blk = b0 + 4 * quad + 2 * p + h;                                    \
                        if (blk < a->blocks && BITS != 8) {                                      \
                            __m256i q = _mm256_loadu_si256((const __m256i *)(codes + blk * BLOCK)); \
                            for (int k = 0; k < K; k++) dot[k][h] = block_dot(q, xq[k], blk);    \
                        } else if (blk < a->blocks) {                                            \
                            __m256i w = centred_codes(codes, blk), size = _mm256_abs_epi8(w);    \
                            for (int k = 0; k < K; k++) dot[k][h] = signed_dot(size, w, xq[k], blk); \
                        } else {                                                                 \
                            for (int k = 0; k < K; k++) dot[k][h] = _mm256_setzero_si256();      \
                        }                                                                        \
                    }                                                                            \
                    for (int k = 0; k < K; k++) pair[k][p] = _mm256_hadd_epi32(dot[k][0], dot[k][1]); \
                }                                                                                \
                for (int k = 0; k < K; k++) half[k][quad] = _mm256_hadd_epi32(pair[k][0], pair[k][1]); \
            }                                                                                    \
            __m256 scale = block_scales(a->scales, first, b0, a->blocks, a->gs, a->type);        \
            for (int k = 0; k < K; k++) {                                                        \
                __m256i sums = _mm256_add_epi32(                                                 \
                    _mm256_permute2x128_si256(half[k][0], half[k][1], 0x20),                     \
                    _mm256_permute2x128_si256(half[k][0], half[k][1], 0x31));                    \
                /* 8-bit codes are centred in registers */                                       \
                acc[k] = add_tree(acc[k], sums, scale, a, r + k, b0, BITS != 8);                 \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < K; k++) a->y[(r + k) * a->y_stride + o] = hsum(acc[k]) + bias_term(a, first, r + k); \
    }

/* ---- int16 activations: the down projections' way ---------------------------------------------
 * A down projection reads silu(gate)·up, whose blocks of 32 hold values hundreds of times their
 * median: int8 steps lose the small ones (the Qwen 1.5B's argmax moved at 7 of 480 positions),
 * and fp32 activations make the product compute-bound (~1.6x its bytes' time). Rounded to int16
 * per block (step peak/32767, 256 times finer than int8) the codes are widened to int16 and
 * multiplied in int16 pairs summed to int32 (madd): a block's Σ q·xq ≤ 32·255·32767 and
 * c·Σ xq ≤ 128·32·32767 fit int32 exactly, then the same tree, centring and scaling as int8's. */

/* Block sums of 16 codes (int16 lanes) times 16 int16 inputs: 8 int32 partial sums. */
static inline __m256i wide_dot(__m256i q, const int16_t *x) {
    return _mm256_madd_epi16(q, _mm256_loadu_si256((const __m256i *)x));
}

/* Blocks blk and blk + 1 (blk even) of codes widened to int16, once for every row: for 4-bit codes
 * (nibble_pair_codes' bytes) blk's even and odd inputs, then blk + 1's; for codes a byte each,
 * blk's first and second 16, then blk + 1's. Zeros past the row's last block. */
static inline void widen_pair(const uint8_t *codes, long blk, long blocks, int bits, __m256i w[4]) {
    const __m256i mask = _mm256_set1_epi16(15), none = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        int here = blk + h < blocks;
        if (bits == 4) {
            __m256i a = here ? _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(codes + (blk + h) * 16)))
                             : none;
            w[2 * h] = _mm256_and_si256(a, mask);
            w[2 * h + 1] = _mm256_srli_epi16(a, 4);
        } else {
            const uint8_t *c = codes + (blk + h) * BLOCK;
            w[2 * h] = here ? _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)c)) : none;
            w[2 * h + 1] = here ? _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(c + 16))) : none;
        }
    }
}

/* The 8 int32 partial sums of blocks blk and blk + 1 of one row: x (int16, from the pair's first
 * input, in the codes' order: nibble_pair_dot's for 4-bit codes) times widen_pair's codes. A row of
 * codes a byte each ends with its last block: past it, x is not read. */
static inline void wide_pair_dot(const __m256i w[4], const int16_t *x, int bits, int second_here,
                                 __m256i *first, __m256i *second) {
    long odd = bits == 4 ? 2 * 16 : 16, next = bits == 4 ? 16 : BLOCK; /* where w[1] and w[2]'s inputs are */
    *first = _mm256_add_epi32(wide_dot(w[0], x), wide_dot(w[1], x + odd));
    *second = bits == 4 || second_here
                  ? _mm256_add_epi32(wide_dot(w[2], x + next), wide_dot(w[3], x + 3 * 16))
                  : _mm256_setzero_si256();
}

/* One output o times K rows from r on int16 rows: per 8 blocks, each row's 8 block sums (as
 * I8ROWS reduces them), centred at the codes' midpoint, converted once and scaled by s·dx. */
#define I16ROWS(BITS, K)                                                                         \
    static void i16rows##BITS##_##K(const struct i8_args *a, long r, long o) {                  \
        const uint8_t *codes = a->w + o * (a->n_in * BITS / 8);                                  \
        long first = o * a->groups;                                                              \
        const int16_t *xw[K];                                                                    \
        for (int k = 0; k < K; k++) xw[k] = a->xw + (r + k) * a->stride;                        \
        __m256 acc[K];                                                                           \
        for (int k = 0; k < K; k++) acc[k] = _mm256_setzero_ps();                                \
        const char *scales = (const char *)a->scales + first * scale_size(a->type);              \
        const char *biases = (const char *)a->biases + first * scale_size(a->type);              \
        for (long b0 = 0; b0 < a->blocks; b0 += TREE) {                                          \
            for (int line = 0; line < BITS / 2; line++)                                          \
                prefetch(codes + b0 * BLOCK * BITS / 8 + PREFETCH_BYTES + 64 * line);            \
            long ahead = b0 * BLOCK / a->gs * scale_size(a->type) + PREFETCH_BYTES / BITS;      \
            prefetch(scales + ahead);                                                            \
            prefetch(biases + ahead);                                                            \
            __m256i half[K][2];                                                                  \
            for (int quad = 0; quad < 2; quad++) {                                               \
                __m256i pair[K][2];                                                              \
                for (int p = 0; p < 2; p++) {                                                    \
                    long blk = b0 + 4 * quad + 2 * p;                                            \
                    __m256i dot[K][2];                                                           \
                    if (blk < a->blocks) {                                                       \
                        __m256i w[4]; /* the codes widened once for the K rows */                \
                        widen_pair(codes, blk, a->blocks, BITS, w);                              \
                        for (int k = 0; k < K; k++)                                              \
                            wide_pair_dot(w, xw[k] + blk * BLOCK, BITS, blk + 1 < a->blocks,     \
                                          &dot[k][0], &dot[k][1]);                               \
                    } else {                                                                     \
                        for (int k = 0; k < K; k++) dot[k][0] = dot[k][1] = _mm256_setzero_si256(); \
                    }                                                                            \
                    for (int k = 0; k < K; k++) pair[k][p] = _mm256_hadd_epi32(dot[k][0], dot[k][1]); \
                }                                                                                \
                for (int k = 0; k < K; k++) half[k][quad] = _mm256_hadd_epi32(pair[k][0], pair[k][1]); \
            }                                                                                    \
            __m256 scale = block_scales(a->scales, first, b0, a->blocks, a->gs, a->type);        \
            for (int k = 0; k < K; k++) {                                                        \
                __m256i sums = _mm256_add_epi32(                                                 \
                    _mm256_permute2x128_si256(half[k][0], half[k][1], 0x20),                     \
                    _mm256_permute2x128_si256(half[k][0], half[k][1], 0x31));                    \
                acc[k] = add_tree(acc[k], sums, scale, a, r + k, b0, 1);                         \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < K; k++) a->y[(r + k) * a->y_stride + o] = hsum(acc[k]) + bias_term(a, first, r + k); \
    }

I16ROWS(4, 1)
I16ROWS(4, 2)
I16ROWS(4, 3)
I16ROWS(4, 4)
I16ROWS(8, 1)
I16ROWS(8, 2)
I16ROWS(8, 3)
I16ROWS(8, 4)

I8NIBBLES(1)
I8NIBBLES(2)
I8NIBBLES(3)
I8NIBBLES(4)
I8ROWS(7, 1)
I8ROWS(7, 2)
I8ROWS(7, 3)
I8ROWS(7, 4)
I8ROWS(8, 1)
I8ROWS(8, 2)
I8ROWS(8, 3)
I8ROWS(8, 4)

typedef void (*i8_fn)(const struct i8_args *, long, long);
static const i8_fn I8_ROWS4[I8_GROUP + 1] = {0, i8rows4_1, i8rows4_2, i8rows4_3, i8rows4_4};
static const i8_fn I8_ROWS7[I8_GROUP + 1] = {0, i8rows7_1, i8rows7_2, i8rows7_3, i8rows7_4};
static const i8_fn I8_ROWS8[I8_GROUP + 1] = {0, i8rows8_1, i8rows8_2, i8rows8_3, i8rows8_4};
static const i8_fn I16_ROWS4[I8_GROUP + 1] = {0, i16rows4_1, i16rows4_2, i16rows4_3, i16rows4_4};
static const i8_fn I16_ROWS8[I8_GROUP + 1] = {0, i16rows8_1, i16rows8_2, i16rows8_3, i16rows8_4};
static const int I8_WIDTH[I8_GROUP + 1] = {0, 1, 1, 1, 1};

static void i8_step(const void *args, int wide, long k, long r, long o) {
    (void)wide; /* every tile is one output wide */
    const struct i8_args *a = args;
    if (a->wide)
        (a->bits == 4 ? I16_ROWS4 : I16_ROWS8)[k](a, r, o);
    else
        (a->bits == 4 ? I8_ROWS4 : a->centre < 7 ? I8_ROWS7 : I8_ROWS8)[k](a, r, o);
}

/* x's rows as int8 (or int16: wide) per block of 32 inputs, each block's step and Σ xq (rows
 * padded with zeros to a whole tree) and each weight group's exact sum. Rows are `stride` codes
 * apart; for 4-bit codes (split) each 64 inputs are laid out as nibble_pair_dot reads them: the
 * even inputs of their first block, of their second, then the odd ones of each (zeros where a row
 * ends mid-pair). */
/* How quantize_rows lays a row's inputs out: as they come; as 4-bit codes' nibbles pair them
 * (nibble_pair_dot); per block, even inputs then odd ones (Q6_K's int16 halves, q6krows); as
 * they come but per 4 inputs 0, 2, 1, 3 (int16 rows as the wide tiles read them). */
enum { SPLIT_NONE = 0, SPLIT_PAIRS = 1, SPLIT_BLOCKS = 2, SPLIT_QUADS = 3, SPLIT_TILE_PAIRS = 4 };
#if defined(NIBBLE_QUADS)
#define NIBBLE_SPLIT SPLIT_QUADS /* 4-bit codes on int8: quad_tree's layout */
#else
#define NIBBLE_SPLIT SPLIT_PAIRS
#endif

/* Row r of quantize_rows' work: its group sums, then each block's step, Σ xq and codes. */
static void quantize_row(const float *x, int8_t *xq, int16_t *xw, float *dx, int32_t *xqsum, float *xsum, long r,
                         long n_in, long gs, long padded, long stride, int split) {
    long groups = n_in / gs, blocks = n_in / BLOCK;
    const float levels = xw ? 32767.f : 127.f;
    if (stride > n_in) { /* a row ending mid-pair: its last pair's unused halves stay zero */
        if (xw)
            memset(xw + r * stride + stride - 2 * BLOCK, 0, 2 * BLOCK * sizeof(int16_t));
        else
            memset(xq + r * stride + stride - 2 * BLOCK, 0, 2 * BLOCK);
    }
    const float *row = x + r * n_in;
    long g = 0;
    for (; g + 8 <= groups; g += 8) { /* eight groups' sums side by side: each in its own order */
        float sum[8] = {0.f};
        for (long i = 0; i < gs; i++)
            for (int j = 0; j < 8; j++) sum[j] += row[(g + j) * gs + i];
        for (int j = 0; j < 8; j++) xsum[r * groups + g + j] = sum[j];
    }
    for (; g < groups; g++) {
        float sum = 0.f;
        for (long i = 0; i < gs; i++) sum += row[g * gs + i];
        xsum[r * groups + g] = sum;
    }
    for (long blk = blocks; blk < padded; blk++) {
        dx[r * padded + blk] = 0.f;
        xqsum[r * padded + blk] = 0;
    }
    for (long blk = 0; blk < blocks; blk++) {
        const float *v = row + blk * BLOCK;
#if defined(__AVX512F__)
        if (split == SPLIT_NONE || split == SPLIT_TILE_PAIRS) {
            /* The scalar loop's operations lane by lane: |v|'s maximum (order-free), one multiply
             * and a round to nearest even each (cvtps2dq, as lrintf), an exact integer sum. */
            __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
            float peak = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            float inverse = peak > 0 ? levels / peak : 0.f;
            dx[r * padded + blk] = peak / levels;
            __m512 scale = _mm512_set1_ps(inverse);
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, scale));
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, scale));
            xqsum[r * padded + blk] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            if (split == SPLIT_TILE_PAIRS) { /* per 4 inputs 0, 2, 1, 3 */
                const __m512i order = _mm512_set_epi32(15, 13, 14, 12, 11, 9, 10, 8, 7, 5, 6, 4, 3, 1, 2, 0);
                q0 = _mm512_permutexvar_epi32(order, q0), q1 = _mm512_permutexvar_epi32(order, q1);
            }
            if (xw) {
                _mm256_storeu_si256((__m256i *)(xw + r * stride + blk * BLOCK), _mm512_cvtepi32_epi16(q0));
                _mm256_storeu_si256((__m256i *)(xw + r * stride + blk * BLOCK + 16), _mm512_cvtepi32_epi16(q1));
            } else {
                _mm_storeu_si128((__m128i *)(xq + r * stride + blk * BLOCK), _mm512_cvtepi32_epi8(q0));
                _mm_storeu_si128((__m128i *)(xq + r * stride + blk * BLOCK + 16), _mm512_cvtepi32_epi8(q1));
            }
            continue;
        }
#endif
        float peak = 0.f;
        for (int i = 0; i < BLOCK; i++) {
            float a = v[i] < 0 ? -v[i] : v[i];
            peak = a > peak ? a : peak;
        }
        float inverse = peak > 0 ? levels / peak : 0.f;
        dx[r * padded + blk] = peak / levels;
        int32_t total = 0;
        for (int k = 0; k < BLOCK; k++) {
            int32_t q = (int32_t)__builtin_lrintf(v[k] * inverse);
            total += q;
            /* SPLIT_PAIRS: pair (blk / 2) is [even of blk & ~1][even of blk | 1][odd ...][odd ...];
             * SPLIT_BLOCKS: block blk is [its even inputs][its odd ones] */
            /* SPLIT_QUADS: as quad_tree reads a whole tree, per 4 blocks their even inputs then
             * their odd ones; the blocks of a last, partial tree as SPLIT_PAIRS lays them */
            int quads = split == SPLIT_QUADS && blk < blocks / TREE * TREE;
            long at = r * stride + (quads ? (blk / 4) * 4 * BLOCK + (k % 2) * 2 * BLOCK + (blk % 4) * 16 + k / 2
                                    : split == SPLIT_PAIRS || split == SPLIT_QUADS
                                        ? (blk / 2) * 2 * BLOCK + (k % 2) * BLOCK + (blk % 2) * 16 + k / 2
                                    : split == SPLIT_BLOCKS     ? blk * BLOCK + (k % 2) * 16 + k / 2
                                    : split == SPLIT_TILE_PAIRS ? blk * BLOCK + (k & ~3) + (k % 2) * 2 + (k % 4) / 2
                                                                : blk * BLOCK + k);
            if (xw)
                xw[at] = (int16_t)q;
            else
                xq[at] = (int8_t)q;
        }
        xqsum[r * padded + blk] = total;
    }
}

struct quantize_args {
    const float *x;
    int8_t *xq;
    int16_t *xw;
    float *dx, *xsum;
    int32_t *xqsum;
    long rows, n_in, gs, padded, stride;
    int split;
};

static void quantize_part(const void *p, long part, long parts) {
    const struct quantize_args *q = p;
    long first, end;
    part_range(q->rows, part, parts, &first, &end);
    for (long r = first; r < end; r++)
        quantize_row(q->x, q->xq, q->xw, q->dx, q->xqsum, q->xsum, r, q->n_in, q->gs, q->padded, q->stride, q->split);
}

/* Rows are independent: several (a check's, a prefill's) are shared among the threads. */
static void quantize_rows(const struct quantize_args *q, int threads) {
    long parts = q->rows * q->n_in >= 8 * 1024 && threads > 1 ? (q->rows < threads ? q->rows : threads) : 1;
    run_parts(quantize_part, q, parts);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* Whether the int8 path takes a weight of this layout. */
static int i8_takes(int bits, int centre, const void *biases, long gs, int type, long n_in) {
    return (bits == 4 || bits == 8) && centre >= 0 && centre < bits && biases && gs >= BLOCK &&
           type >= SCALE_F32 && type <= SCALE_BF16 && gs % BLOCK == 0 && n_in % gs == 0;
}

static void i8_release(struct i8_args *a) {
    free((void *)a->xq);
    free((void *)a->xw);
    free((void *)a->dx);
    free((void *)a->xsum);
    free((void *)a->xqsum);
}

/* A weight's arguments with x's rows rounded for it (its layout and groups; to int16 where wide); 0,
 * or -1 without memory (nothing then held). natural: 0 the layout the few-row paths read (by the
 * codes' bits), 1 inputs as they come, 2 as they come but int16 rows as the wide tiles read them
 * (SPLIT_TILE_PAIRS). Many rows are rounded on `threads`. */
static int i8_prepare(struct i8_args *a, const float *x, long rows, long n_in, const void *codes,
                      const void *scales, const void *biases, float *y, long y_stride, long n_out, long gs,
                      int bits, int type, int centre, int wide, int natural, int threads) {
    long groups = n_in / gs, blocks = n_in / BLOCK, padded = (blocks + TREE - 1) / TREE * TREE;
    long stride = bits == 4 && !natural ? (n_in + 2 * BLOCK - 1) / (2 * BLOCK) * (2 * BLOCK) : n_in;
    int8_t *xq = wide ? NULL : malloc((size_t)rows * stride);
    int16_t *xw = wide ? malloc(sizeof(int16_t) * rows * stride) : NULL;
    float *dx = malloc(sizeof(float) * rows * padded), *xsum = malloc(sizeof(float) * rows * groups);
    int32_t *xqsum = malloc(sizeof(int32_t) * rows * padded);
    *a = (struct i8_args){xq, xw, dx, xsum, xqsum, codes, scales, biases, y, y_stride, n_in, n_out, gs, groups,
                          blocks, padded, stride, bits, centre, type, wide};
    if ((!xq && !xw) || !dx || !xsum || !xqsum) {
        i8_release(a);
        return -1;
    }
    int split = natural == 2 && wide ? SPLIT_TILE_PAIRS
                : natural        ? SPLIT_NONE
                : bits == 4      ? (wide ? SPLIT_PAIRS : NIBBLE_SPLIT)
                : bits == 6      ? SPLIT_BLOCKS
                                 : SPLIT_NONE;
    struct quantize_args q = {x, xq, xw, dx, xsum, xqsum, rows, n_in, gs, padded, stride, split};
    quantize_rows(&q, threads);
    return 0;
}
#endif

/* ---- many rows on integer activations (a prefill) ------------------------------------------
 * The fp32 panel multiplies 8 weights an instruction; dot_bytes 32, dot_pairs 16. Each thread takes
 * GEMM_OUT outputs at a time and lays their codes out with outputs side by side: per block of 32
 * inputs and quad of 4, each output's 4 codes in its own int32 lane (two vectors of 8 outputs).
 * A row's quad of xq broadcast to every lane then multiplies 8 outputs at once, summed down the
 * lanes with no horizontal adds; each block's sum is centred, converted and scaled by s·dx in
 * fp32 as the few-row path scales it, and the biases (b + c·s)·Σx per group follow. On int16
 * activations (a down projection's) the lanes hold pairs of codes widened to int16 instead. A
 * row's float operations do not depend on the rows beside it, nor on the threads. */
#if defined(__AVX2__) && defined(__FMA__)
#define GEMM_OUT 16 /* outputs a tile holds: two vectors of 8, or one of AVX-512's 16 */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define GEMM_512 1
#define GEMM_ROWS 8 /* rows multiplied per read of a tile: 8·2 accumulators of AVX-512's 32 registers */
#elif defined(__AVX512VL__)
#define GEMM_ROWS 4 /* 4·4 accumulators of AVX-512's 32 registers */
#else
#define GEMM_ROWS 2 /* of AVX2's 16 */
#endif
#if defined(GEMM_512) || defined(__F16C__)
#define TILES 1 /* weights laid out as tiles at load (quant_tile_pack): one 512-bit vector a run, or two of AVX2's */
#define TILE_ROWS (GEMM_ROWS > 4 ? GEMM_ROWS : 4) /* rows per read of a laid-out tile */
#endif

/* Whether the many-row integer path takes these codes: on int16 activations (wide) any, their
 * pairs' products summed exactly in int32; on int8 4-bit codes or bytes below 128 (exact in
 * maddubs' int16 pairs), or any byte where dot_bytes is one VNNI instruction (no int16 pairs). */
static int gemm_takes(int bits, int centre, int wide) {
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
    const int full_bytes = 1;
#else
    const int full_bytes = 0;
#endif
    if (bits == 6) return wide; /* Q6_K blocks: int16 activations */
    return bits == 4 || (bits == 8 && (wide || centre < 7 || full_bytes));
}

/* acc + w · x by pairs of int16 (int32 lane i adds w[2i]·x[2i] + w[2i+1]·x[2i+1]). */
static inline __m256i dot_pairs(__m256i acc, __m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, w, x);
#elif defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, w, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
#endif
}

struct gemm_tile {
    uint32_t *codes; /* blocks · 8 quads · GEMM_OUT: an output's 4 codes of a quad a lane (wide:
                      * blocks · 16 pairs · GEMM_OUT, a pair's 2 codes as int16) */
    float *scales;   /* blocks · GEMM_OUT: each output's scale of each block */
    float *biases;   /* groups · GEMM_OUT: each output's b + c·s of each group */
    uint8_t *bytes;  /* GEMM_OUT · n_in: 4-bit codes unpacked a byte each */
};

/* Outputs o0..o0 + width - 1 laid out as the tile (zeros past width). */
static void gemm_fill(const struct i8_args *a, long o0, long width, const struct gemm_tile *t) {
    const long n_in = a->n_in, quads = n_in / 4;
    const float centre = (float)(1 << a->centre);
    const __m128i low = _mm_set1_epi8(15);
    for (long j = 0; j < GEMM_OUT; j++) {
        long o = o0 + j;
        const uint8_t *row = a->w + o * n_in;
        if (j >= width) {
            for (long q = 0; q < (a->wide ? 2 : 1) * quads; q++) t->codes[q * GEMM_OUT + j] = 0;
            for (long b = 0; b < a->blocks; b++) t->scales[b * GEMM_OUT + j] = 0.f;
            for (long g = 0; g < a->groups; g++) t->biases[g * GEMM_OUT + j] = 0.f;
            continue;
        }
        if (a->bits == 4) { /* byte k holds codes 2k (low nibble) and 2k + 1 */
            const uint8_t *packed = a->w + o * (n_in / 2);
            uint8_t *out = t->bytes + j * n_in;
            for (long i = 0; i < n_in / 2; i += 16) {
                __m128i v = _mm_loadu_si128((const __m128i *)(packed + i));
                __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
                _mm_storeu_si128((__m128i *)(out + 2 * i), _mm_unpacklo_epi8(lo, hi));
                _mm_storeu_si128((__m128i *)(out + 2 * i + 16), _mm_unpackhi_epi8(lo, hi));
            }
            row = out;
        }
        if (a->wide)
            for (long q = 0; q < 2 * quads; q++)
                t->codes[q * GEMM_OUT + j] = (uint32_t)row[2 * q] | (uint32_t)row[2 * q + 1] << 16;
        else
            for (long q = 0; q < quads; q++) memcpy(t->codes + q * GEMM_OUT + j, row + 4 * q, 4);
        long first = o * a->groups;
        for (long b = 0; b < a->blocks; b++)
            t->scales[b * GEMM_OUT + j] = scale_at(a->scales, first + b * BLOCK / a->gs, a->type);
        for (long g = 0; g < a->groups; g++)
            t->biases[g * GEMM_OUT + j] =
                scale_at(a->biases, first + g, a->type) + centre * scale_at(a->scales, first + g, a->type);
    }
}

/* K rows from r times the tile: out (K × GEMM_OUT). WIDE: int16 activations (xw), the tile's
 * codes int16 pairs; else int8 (xq), quads of byte codes. */
#define GEMM_TIMES(K, WIDE, NAME)                                                                \
    static void NAME(const struct i8_args *a, const struct gemm_tile *t, long r, float *out) { \
        __m256 acc[K][2];                                                                        \
        for (int k = 0; k < K; k++) acc[k][0] = acc[k][1] = _mm256_setzero_ps();                \
        const char *xrow[K]; /* a row's activations, as bytes */                                 \
        for (int k = 0; k < K; k++)                                                              \
            xrow[k] = WIDE ? (const char *)(a->xw + (r + k) * a->stride)                        \
                           : (const char *)(a->xq + (r + k) * a->stride);                        \
        const long steps = WIDE ? 16 : 8; /* lanes of 4 bytes a block of 32 inputs takes */      \
        for (long b = 0; b < a->blocks; b++) {                                                   \
            const uint32_t *w = t->codes + b * steps * GEMM_OUT;                                 \
            __m256i sum[K][2];                                                                   \
            for (int k = 0; k < K; k++) sum[k][0] = sum[k][1] = _mm256_setzero_si256();          \
            for (int q = 0; q < steps; q++) {                                                    \
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + q * GEMM_OUT));           \
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + q * GEMM_OUT + 8));       \
                for (int k = 0; k < K; k++) {                                                    \
                    int32_t lane;                                                                \
                    memcpy(&lane, xrow[k] + (b * steps + q) * 4, 4);                             \
                    __m256i x = _mm256_set1_epi32(lane);                                         \
                    sum[k][0] = WIDE ? dot_pairs(sum[k][0], w0, x) : dot_bytes(sum[k][0], w0, x); \
                    sum[k][1] = WIDE ? dot_pairs(sum[k][1], w1, x) : dot_bytes(sum[k][1], w1, x); \
                }                                                                                \
            }                                                                                    \
            __m256 s0 = _mm256_loadu_ps(t->scales + b * GEMM_OUT);                               \
            __m256 s1 = _mm256_loadu_ps(t->scales + b * GEMM_OUT + 8);                           \
            for (int k = 0; k < K; k++) {                                                        \
                long at = (r + k) * a->padded + b;                                               \
                __m256i c = _mm256_set1_epi32(a->xqsum[at] << a->centre);                        \
                __m256 dx = _mm256_set1_ps(a->dx[at]);                                           \
                acc[k][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sum[k][0], c)),  \
                                            _mm256_mul_ps(s0, dx), acc[k][0]);                   \
                acc[k][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sum[k][1], c)),  \
                                            _mm256_mul_ps(s1, dx), acc[k][1]);                   \
            }                                                                                    \
        }                                                                                        \
        for (long g = 0; g < a->groups; g++) {                                                   \
            __m256 b0 = _mm256_loadu_ps(t->biases + g * GEMM_OUT);                               \
            __m256 b1 = _mm256_loadu_ps(t->biases + g * GEMM_OUT + 8);                           \
            for (int k = 0; k < K; k++) {                                                        \
                __m256 xs = _mm256_set1_ps(a->xsum[(r + k) * a->groups + g]);                    \
                acc[k][0] = _mm256_fmadd_ps(b0, xs, acc[k][0]);                                  \
                acc[k][1] = _mm256_fmadd_ps(b1, xs, acc[k][1]);                                  \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < K; k++) {                                                            \
            _mm256_storeu_ps(out + k * GEMM_OUT, acc[k][0]);                                     \
            _mm256_storeu_ps(out + k * GEMM_OUT + 8, acc[k][1]);                                 \
        }                                                                                        \
    }

/* Q6_K outputs o0..o0 + width - 1 as the tile (zeros past width): per sub-block of 16 inputs
 * and pair, each output's 2 codes centred (q - 32) as int16; per sub-block each output's
 * d·scale, as ggml computes a value: (d·scale)·(q - 32). */
static void gemm_fill_q6k(const struct i8_args *a, long o0, long width, const struct gemm_tile *t) {
    const long blocks = a->n_in / Q6K_VALUES, pairs = a->n_in / 2, subs = a->n_in / 16;
    int16_t *codes = (int16_t *)(void *)t->bytes; /* one output's codes at a time */
    for (long j = 0; j < GEMM_OUT; j++) {
        if (j >= width) {
            for (long q = 0; q < pairs; q++) t->codes[q * GEMM_OUT + j] = 0;
            for (long u = 0; u < subs; u++) t->scales[u * GEMM_OUT + j] = 0.f;
            continue;
        }
        const uint8_t *block = a->w + (o0 + j) * blocks * Q6K_BYTES;
        for (long b = 0; b < blocks; b++, block += Q6K_BYTES) {
            float d = q6k_d(block);
            for (int n = 0; n < 2; n++) {
                const uint8_t *ql = block + 64 * n, *qh = block + 128 + 32 * n;
                const int8_t *sc = (const int8_t *)(block + 192) + 8 * n;
                int16_t *c = codes + b * Q6K_VALUES + 128 * n;
                for (int l = 0; l < 32; l++) {
                    c[l] = (int16_t)(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
                    c[l + 32] = (int16_t)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    c[l + 64] = (int16_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    c[l + 96] = (int16_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
                for (int u = 0; u < 8; u++) t->scales[(b * 16 + 8 * n + u) * GEMM_OUT + j] = d * sc[u];
            }
        }
        for (long q = 0; q < pairs; q++)
            t->codes[q * GEMM_OUT + j] = (uint32_t)(uint16_t)codes[2 * q] | (uint32_t)(uint16_t)codes[2 * q + 1] << 16;
    }
}

/* K rows from r times a Q6_K tile: per sub-block of 16 inputs, 8 pairs; its sum scaled by
 * d·scale·dx (dx: its block of 32's). Codes centred in the tile: no centring term, no biases. */
#define GEMM_Q6K(K)                                                                              \
    static void gemm_q6k_##K(const struct i8_args *a, const struct gemm_tile *t, long r, float *out) { \
        __m256 acc[K][2];                                                                        \
        for (int k = 0; k < K; k++) acc[k][0] = acc[k][1] = _mm256_setzero_ps();                \
        const char *xrow[K];                                                                     \
        for (int k = 0; k < K; k++) xrow[k] = (const char *)(a->xw + (r + k) * a->stride);      \
        for (long u = 0; u < a->n_in / 16; u++) {                                                \
            const uint32_t *w = t->codes + u * 8 * GEMM_OUT;                                     \
            __m256i sum[K][2];                                                                   \
            for (int k = 0; k < K; k++) sum[k][0] = sum[k][1] = _mm256_setzero_si256();          \
            for (int q = 0; q < 8; q++) {                                                        \
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + q * GEMM_OUT));           \
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + q * GEMM_OUT + 8));       \
                for (int k = 0; k < K; k++) {                                                    \
                    int32_t lane;                                                                \
                    memcpy(&lane, xrow[k] + (u * 8 + q) * 4, 4);                                 \
                    __m256i x = _mm256_set1_epi32(lane);                                         \
                    sum[k][0] = dot_pairs(sum[k][0], w0, x);                                     \
                    sum[k][1] = dot_pairs(sum[k][1], w1, x);                                     \
                }                                                                                \
            }                                                                                    \
            __m256 s0 = _mm256_loadu_ps(t->scales + u * GEMM_OUT);                               \
            __m256 s1 = _mm256_loadu_ps(t->scales + u * GEMM_OUT + 8);                           \
            for (int k = 0; k < K; k++) {                                                        \
                __m256 dx = _mm256_set1_ps(a->dx[(r + k) * a->padded + u / 2]);                  \
                acc[k][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[k][0]), _mm256_mul_ps(s0, dx), acc[k][0]); \
                acc[k][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[k][1]), _mm256_mul_ps(s1, dx), acc[k][1]); \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < K; k++) {                                                            \
            _mm256_storeu_ps(out + k * GEMM_OUT, acc[k][0]);                                     \
            _mm256_storeu_ps(out + k * GEMM_OUT + 8, acc[k][1]);                                 \
        }                                                                                        \
    }

typedef void (*gemm_fn)(const struct i8_args *, const struct gemm_tile *, long, float *);
#if defined(GEMM_512)
/* The same products with a tile's 16 outputs in one AVX-512 vector: per lane the same integer
 * sums and the same float operations in the same order, so the same bits as two vectors of 8.
 * MODE 0: int8 (quads of byte codes, a scale per 8 lanes of 4 inputs), 1: int16 (pairs, a scale
 * per 16 lanes), 2: Q6_K (pairs, a scale per 8 lanes of 2 inputs: 16 inputs; dx per 32). */
#define GEMM_TIMES_512(K, MODE, NAME)                                                            \
    static void NAME(const struct i8_args *a, const struct gemm_tile *t, long r, float *out) { \
        __m512 acc[K];                                                                           \
        for (int k = 0; k < K; k++) acc[k] = _mm512_setzero_ps();                                \
        const char *xrow[K];                                                                     \
        for (int k = 0; k < K; k++)                                                              \
            xrow[k] = MODE ? (const char *)(a->xw + (r + k) * a->stride)                        \
                           : (const char *)(a->xq + (r + k) * a->stride);                        \
        const long steps = MODE == 1 ? 16 : 8; /* lanes of 4 bytes a scale covers */             \
        const long spans = MODE == 2 ? a->n_in / 16 : a->blocks;                                 \
        for (long u = 0; u < spans; u++) {                                                       \
            const uint32_t *w = t->codes + u * steps * GEMM_OUT;                                 \
            __m512i sum[K];                                                                      \
            for (int k = 0; k < K; k++) sum[k] = _mm512_setzero_si512();                         \
            for (int q = 0; q < steps; q++) {                                                    \
                __m512i wq = _mm512_loadu_si512((const void *)(w + q * GEMM_OUT));              \
                for (int k = 0; k < K; k++) {                                                    \
                    int32_t lane;                                                                \
                    memcpy(&lane, xrow[k] + (u * steps + q) * 4, 4);                             \
                    __m512i x = _mm512_set1_epi32(lane);                                         \
                    sum[k] = MODE ? _mm512_dpwssd_epi32(sum[k], wq, x) : _mm512_dpbusd_epi32(sum[k], wq, x); \
                }                                                                                \
            }                                                                                    \
            __m512 scale = _mm512_loadu_ps(t->scales + u * GEMM_OUT);                            \
            for (int k = 0; k < K; k++) {                                                        \
                long at = (r + k) * a->padded + (MODE == 2 ? u / 2 : u);                         \
                __m512i centred = MODE == 2 ? sum[k]                                             \
                                            : _mm512_sub_epi32(sum[k], _mm512_set1_epi32(a->xqsum[at] << a->centre)); \
                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(centred), _mm512_mul_ps(scale, _mm512_set1_ps(a->dx[at])), \
                                         acc[k]);                                                \
            }                                                                                    \
        }                                                                                        \
        for (long g = 0; MODE != 2 && g < a->groups; g++) {                                      \
            __m512 bias = _mm512_loadu_ps(t->biases + g * GEMM_OUT);                             \
            for (int k = 0; k < K; k++)                                                          \
                acc[k] = _mm512_fmadd_ps(bias, _mm512_set1_ps(a->xsum[(r + k) * a->groups + g]), acc[k]); \
        }                                                                                        \
        for (int k = 0; k < K; k++) _mm512_storeu_ps(out + k * GEMM_OUT, acc[k]);                \
    }
#define GEMM_MODE_512(MODE, PREFIX)                                                              \
    GEMM_TIMES_512(1, MODE, PREFIX##1) GEMM_TIMES_512(2, MODE, PREFIX##2) GEMM_TIMES_512(3, MODE, PREFIX##3) \
    GEMM_TIMES_512(4, MODE, PREFIX##4) GEMM_TIMES_512(5, MODE, PREFIX##5) GEMM_TIMES_512(6, MODE, PREFIX##6) \
    GEMM_TIMES_512(7, MODE, PREFIX##7) GEMM_TIMES_512(8, MODE, PREFIX##8)
GEMM_MODE_512(0, gemm512_rows_)
GEMM_MODE_512(1, gemm512_wide_)
GEMM_MODE_512(2, gemm512_q6k_)
#define GEMM_ROW_FNS(PREFIX) {0, PREFIX##1, PREFIX##2, PREFIX##3, PREFIX##4, PREFIX##5, PREFIX##6, PREFIX##7, PREFIX##8}
static const gemm_fn GEMM_FN[3][GEMM_ROWS + 1] = {GEMM_ROW_FNS(gemm512_rows_), GEMM_ROW_FNS(gemm512_wide_),
                                                  GEMM_ROW_FNS(gemm512_q6k_)};
#else
GEMM_TIMES(1, 0, gemm_rows_1)
GEMM_TIMES(2, 0, gemm_rows_2)
GEMM_TIMES(1, 1, gemm_wide_1)
GEMM_TIMES(2, 1, gemm_wide_2)
#if GEMM_ROWS > 2
GEMM_TIMES(3, 0, gemm_rows_3)
GEMM_TIMES(4, 0, gemm_rows_4)
GEMM_TIMES(3, 1, gemm_wide_3)
GEMM_TIMES(4, 1, gemm_wide_4)
GEMM_Q6K(1)
GEMM_Q6K(2)
GEMM_Q6K(3)
GEMM_Q6K(4)
static const gemm_fn GEMM_FN[3][GEMM_ROWS + 1] = {{0, gemm_rows_1, gemm_rows_2, gemm_rows_3, gemm_rows_4},
                                                  {0, gemm_wide_1, gemm_wide_2, gemm_wide_3, gemm_wide_4},
                                                  {0, gemm_q6k_1, gemm_q6k_2, gemm_q6k_3, gemm_q6k_4}};
#else
GEMM_Q6K(1)
GEMM_Q6K(2)
static const gemm_fn GEMM_FN[3][GEMM_ROWS + 1] = {
    {0, gemm_rows_1, gemm_rows_2}, {0, gemm_wide_1, gemm_wide_2}, {0, gemm_q6k_1, gemm_q6k_2}};
#endif
#endif /* GEMM_512 */

struct gemm_args {
    const struct i8_args *a;
    long rows;
    atomic_int failed;
};

static void gemm_part(const void *p, long part, long parts) {
    struct gemm_args *g = (struct gemm_args *)p;
    const struct i8_args *a = g->a;
    long first, end;
    part_range((a->n_out + GEMM_OUT - 1) / GEMM_OUT, part, parts, &first, &end);
    if (first >= end) return;
    const int q6k = a->bits == 6; /* Q6_K blocks: a scale per 16 inputs */
    struct gemm_tile t = {malloc(sizeof(uint32_t) * a->n_in / (a->wide ? 2 : 4) * GEMM_OUT),
                          malloc(sizeof(float) * a->n_in / (q6k ? 16 : BLOCK) * GEMM_OUT),
                          malloc(sizeof(float) * a->groups * GEMM_OUT), malloc((size_t)a->n_in * GEMM_OUT)};
    float out[GEMM_ROWS * GEMM_OUT];
    if (!t.codes || !t.scales || !t.biases || !t.bytes) atomic_store(&g->failed, 1);
    for (long tile = first; tile < end && !atomic_load(&g->failed); tile++) {
        long o0 = tile * GEMM_OUT, width = a->n_out - o0 < GEMM_OUT ? a->n_out - o0 : GEMM_OUT;
        (q6k ? gemm_fill_q6k : gemm_fill)(a, o0, width, &t);
        for (long r = 0; r < g->rows; r += GEMM_ROWS) {
            long k = g->rows - r < GEMM_ROWS ? g->rows - r : GEMM_ROWS;
            GEMM_FN[q6k ? 2 : a->wide][k](a, &t, r, out);
            for (long rr = 0; rr < k; rr++)
                memcpy(a->y + (r + rr) * a->y_stride + o0, out + rr * GEMM_OUT, sizeof(float) * width);
        }
    }
    free(t.codes);
    free(t.scales);
    free(t.biases);
    free(t.bytes);
}
#endif

/* Whether this build has the integer paths at all (AVX2): elsewhere quant_rows_int8 and q6k_rows
 * multiply every row on fp32 activations, and the caller's reference is the exact product. */
int quant_integer_paths(void) {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

/* Whether quant_rows_int8 multiplies many rows of these codes on int8 activations (else on the
 * fp32 panel): the caller's reference for what it computes. */
int quant_gemm_takes(int bits, int centre, int wide) {
#if defined(__AVX2__) && defined(__FMA__)
    return gemm_takes(bits, centre, wide);
#else
    (void)bits, (void)centre, (void)wide;
    return 0;
#endif
}

/* quant_rows with int8 activations (int16 where `wide`) where they apply (groups a multiple of 32,
 * an AVX2 build; `centre`: log2 of the codes' midpoint, 3 for 4-bit codes, 4 for 5-bit codes in
 * bytes...): fewer than `many_from` rows in registers, more through the integer tiles where
 * gemm_takes; anything else is quant_rows itself. */
int quant_rows_int8(const float *x, const void *codes, const void *scales, const void *biases,
                    float *y, long rows, long n_in, long n_out, long gs, int bits, int threads,
                    long many_from, int type, int centre, int wide) {
#if defined(__AVX2__) && defined(__FMA__)
    if (i8_takes(bits, centre, biases, gs, type, n_in) && rows >= 1 && rows < many_from) {
        struct i8_args args;
        if (i8_prepare(&args, x, rows, n_in, codes, scales, biases, y, n_out, n_out, gs, bits, type, centre,
                       wide, 0, 1))
            return -1;
        threads = for_each_tile(I8_WIDTH, I8_GROUP, rows, n_out, threads < 1 ? 1 : threads, i8_step, &args);
        i8_release(&args);
        return threads;
    }
    if (i8_takes(bits, centre, biases, gs, type, n_in) && gemm_takes(bits, centre, wide) && rows >= many_from &&
        n_out >= 1) {
        struct i8_args args;
        if (i8_prepare(&args, x, rows, n_in, codes, scales, biases, y, n_out, n_out, gs, bits, type, centre, wide, 1,
                       threads))
            return -1;
        struct gemm_args g = {&args, rows, 0};
        threads = (int)run_parts(gemm_part, &g, threads < 1 ? 1 : threads);
        i8_release(&args);
        return atomic_load(&g.failed) ? -1 : threads;
    }
#else
    (void)centre, (void)wide;
#endif
    return quant_rows(x, codes, scales, biases, y, rows, n_in, n_out, gs, bits, threads, many_from, type);
}

/* ---- several weights on the same rows in one call ---------------------------------------------
 * A decoder block's q, k and v projections (and its gate and up) multiply the same rows: one call,
 * the rows rounded once per layout, and one pass of the pool over all their outputs, where a call
 * each paid Python's call, the rounding, a wake of the pool and the prefetcher's ramp on a small
 * weight. Each output is computed as
 * quant_rows_int8 computes it, so the bits are the same; y holds the weights' outputs side by side
 * (rows × Σ n_out, in order). The int8 path only: the caller sends other products one at a time. */
struct quant_weight {
    const void *codes, *scales, *biases;
    long n_out, gs;
    int bits, type, centre;
};

#define MANY_WEIGHTS 8

#if defined(__AVX2__) && defined(__FMA__)
struct i8_many_args {
    long count, rows, total;
    long first[MANY_WEIGHTS + 1]; /* weight i's outputs are first[i]..first[i + 1] - 1 of y's */
    struct i8_args weights[MANY_WEIGHTS];
};

static void i8_many_part(const void *p, long part, long parts) {
    const struct i8_many_args *m = p;
    long lo, hi;
    part_range(m->total, part, parts, &lo, &hi);
    for (long i = 0; i < m->count; i++) {
        long from = lo > m->first[i] ? lo : m->first[i], to = hi < m->first[i + 1] ? hi : m->first[i + 1];
        for (long o = from; o < to; o++)
            for (long r = 0; r < m->rows; r += I8_GROUP)
                i8_step(&m->weights[i], 1, m->rows - r < I8_GROUP ? m->rows - r : I8_GROUP, r, o - m->first[i]);
    }
}
#endif

/* y (rows × Σ n_out) = x (rows × n_in) · [W_0 … W_count-1]ᵀ on int8 activations (as
 * quant_rows_int8 gives each). Returns the threads used; -1 where a weight is not one the int8
 * path takes (or rows ≥ I8 limits, no AVX2) or on no memory: the caller multiplies one at a time. */
int quant_rows_int8_many(const float *x, float *y, long rows, long n_in, int threads, long count,
                         const struct quant_weight *w) {
#if defined(__AVX2__) && defined(__FMA__)
    if (count < 1 || count > MANY_WEIGHTS || rows < 1) return -1;
    struct i8_many_args m = {count, rows, 0, {0}, {{0}}};
    for (long i = 0; i < count; i++) {
        if (!i8_takes(w[i].bits, w[i].centre, w[i].biases, w[i].gs, w[i].type, n_in) || w[i].n_out < 1) return -1;
        m.first[i + 1] = m.first[i] + w[i].n_out;
    }
    m.total = m.first[count];
    /* x's rows are rounded once per layout (container bits, groups): a block's q, k and v share it */
    int rounds[MANY_WEIGHTS]; /* whether weight i holds its own rounded rows (to free) */
    for (long i = 0; i < count; i++) {
        long same = 0;
        while (same < i && !(w[same].bits == w[i].bits && w[same].gs == w[i].gs)) same++;
        rounds[i] = same == i;
        if (!rounds[i]) {
            struct i8_args *a = &m.weights[i];
            *a = m.weights[same];
            a->w = w[i].codes, a->scales = w[i].scales, a->biases = w[i].biases;
            a->y = y + m.first[i], a->n_out = w[i].n_out, a->type = w[i].type, a->centre = w[i].centre;
        } else if (i8_prepare(&m.weights[i], x, rows, n_in, w[i].codes, w[i].scales, w[i].biases,
                              y + m.first[i], m.total, w[i].n_out, w[i].gs, w[i].bits, w[i].type,
                              w[i].centre, 0, 0, 1)) {
            while (i-- > 0)
                if (rounds[i]) i8_release(&m.weights[i]);
            return -1;
        }
    }
    threads = (int)run_parts(i8_many_part, &m, threads < 1 ? 1 : threads);
    for (long i = 0; i < count; i++)
        if (rounds[i]) i8_release(&m.weights[i]);
    return threads;
#else
    (void)x, (void)y, (void)rows, (void)n_in, (void)threads, (void)count, (void)w;
    return -1;
#endif
}

/* ---- Q6_K weights (their layout: q6k_dequantize_tile) ---------------------------------------
 * Few rows: x rounded to int16 per block of 32 (as the down projections' wide path rounds it),
 * the codes centred in registers (q - 32, -32..31), widened to int16 and multiplied in int16
 * pairs summed exactly in int32 (a sub-block's Σ ≤ 16·32·32767 < 2^24, so any part of it converts
 * to fp32 exactly), scaled by d·scale·dx in fp32 (q6krows). Many rows (a prefill), and without
 * AVX2: rows dequantized into the panel as the affine weights' are. */
#if defined(__AVX2__) && defined(__FMA__)
/* Half n of a block's codes, centred: v[j] holds values 32j..32j+31 of the half as q - 32. */
static inline void q6k_half_codes(const uint8_t *block, int n, __m256i v[4]) {
    const uint8_t *ql = block + 64 * n, *qh = block + 128 + 32 * n;
    const __m256i low = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3), centre = _mm256_set1_epi8(32);
    __m256i l1 = _mm256_loadu_si256((const __m256i *)ql), l2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    /* shifts by 16-bit lanes: the masks drop what a neighbouring byte shifted in */
    __m256i nibble[4] = {_mm256_and_si256(l1, low), _mm256_and_si256(l2, low),
                         _mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                         _mm256_and_si256(_mm256_srli_epi16(l2, 4), low)};
    for (int j = 0; j < 4; j++) {
        __m256i top = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * j), two), 4);
        v[j] = _mm256_sub_epi8(_mm256_or_si256(nibble[j], top), centre);
    }
}

/* Output o of a Q6_K weight times K rows from r. WIDE: int16 rows. A vector of 32 codes is one
 * block of x and two sub-blocks of W: its even and odd codes, sign-extended to int16 in place
 * (shifts, not shuffles: a shuffle port was what bounded the first version), times x's even and
 * odd inputs (quantize_rows' SPLIT_BLOCKS) give 8 int32 sums, lanes 0-3 the first sub-block's and
 * 4-7 the second's, each exact in fp32 and scaled there by d·scale·dx: no horizontal adds.
 * Else int8 rows (a layer that takes int8 activations: an output head): the 32 centred codes
 * (q - 32, s8) times the row's 32 inputs moved to u8 (x + 128, its top bit flipped) by groups of 4:
 * Σ (q - 32)(x + 128) = Σ (q - 32)·x + 128·Σ (q - 32), the second term the weight's own (one
 * product of 128s, shared by the K rows). Without VNNI, maddubs' int16 pairs hold it exactly:
 * 255·32·2 < 32768. The same lanes, scaled the same way. */
#define Q6KROWS(K, WIDE, NAME)                                                                   \
    static void NAME(const struct i8_args *a, long r, long o) {                                 \
        long blocks = a->n_in / Q6K_VALUES;                                                      \
        const uint8_t *row = a->w + o * blocks * Q6K_BYTES;                                      \
        const char *xrow[K]; /* a row's activations, as bytes */                                 \
        const float *dx[K];                                                                      \
        for (int k = 0; k < K; k++) {                                                            \
            xrow[k] = WIDE ? (const char *)(a->xw + (r + k) * a->stride) : (const char *)(a->xq + (r + k) * a->stride); \
            dx[k] = a->dx + (r + k) * a->padded;                                                 \
        }                                                                                        \
        __m256 acc[K];                                                                           \
        for (int k = 0; k < K; k++) acc[k] = _mm256_setzero_ps();                                \
        const __m256i flip = _mm256_set1_epi8((char)0x80); /* as u8: 128 */                      \
        for (long b = 0; b < blocks; b++) {                                                      \
            const uint8_t *block = row + b * Q6K_BYTES;                                          \
            for (int line = 0; line < 4; line++) prefetch(block + PREFETCH_BYTES + 64 * line);   \
            const __m256 d = _mm256_set1_ps(q6k_d(block));                                       \
            for (int n = 0; n < 2; n++) {                                                        \
                __m256i v[4];                                                                    \
                q6k_half_codes(block, n, v);                                                     \
                __m128i sc = _mm_loadl_epi64((const __m128i *)(block + 192 + 8 * n));            \
                __m256 scales = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));  \
                for (int j = 0; j < 4; j++) {                                                    \
                    /* sub-blocks 2j and 2j + 1's scales, 4 lanes each */                        \
                    __m256 step = _mm256_permutevar8x32_ps(                                      \
                        scales, _mm256_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1)); \
                    __m256i even = WIDE ? _mm256_srai_epi16(_mm256_slli_epi16(v[j], 8), 8) : v[j]; \
                    __m256i odd = WIDE ? _mm256_srai_epi16(v[j], 8) : v[j];                      \
                    __m256i own = WIDE ? v[j] : dot_bytes(_mm256_setzero_si256(), flip, v[j]);   \
                    long blk = (b * Q6K_VALUES + 128 * n) / BLOCK + j;                           \
                    for (int k = 0; k < K; k++) {                                                \
                        __m256i sums;                                                            \
                        if (WIDE) {                                                              \
                            const int16_t *x = (const int16_t *)xrow[k] + blk * BLOCK;           \
                            sums = _mm256_add_epi32(wide_dot(even, x), wide_dot(odd, x + 16));   \
                        } else {                                                                 \
                            __m256i x = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(xrow[k] + blk * BLOCK)), flip); \
                            sums = _mm256_sub_epi32(dot_bytes(_mm256_setzero_si256(), x, v[j]), own); \
                        }                                                                        \
                        __m256 scale = _mm256_mul_ps(step, _mm256_broadcast_ss(dx[k] + blk));    \
                        acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[k]);       \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < K; k++) a->y[(r + k) * a->y_stride + o] = hsum(acc[k]);             \
    }

Q6KROWS(1, 1, q6krows_1)
Q6KROWS(2, 1, q6krows_2)
Q6KROWS(3, 1, q6krows_3)
Q6KROWS(4, 1, q6krows_4)
Q6KROWS(1, 0, q6krows8_1)
Q6KROWS(2, 0, q6krows8_2)
Q6KROWS(3, 0, q6krows8_3)
Q6KROWS(4, 0, q6krows8_4)

static const i8_fn Q6K_ROWS[2][I8_GROUP + 1] = {{0, q6krows8_1, q6krows8_2, q6krows8_3, q6krows8_4},
                                                {0, q6krows_1, q6krows_2, q6krows_3, q6krows_4}};

static void q6k_step(const void *args, int wide, long k, long r, long o) {
    (void)wide; /* every tile is one output wide */
    const struct i8_args *a = args;
    Q6K_ROWS[a->wide][k](a, r, o);
}
#endif

/* y (rows × n_out) = x (rows × n_in) · Wᵀ for a Q6_K weight (n_in a multiple of 256): on integer
 * activations where `integer` (an AVX2 build), fewer than many_from rows in registers (int16
 * where `wide`, else int8), more through the tiles (int16); else in fp32 through the panel. Returns the threads used, or -1 on a bad argument or no memory. */
int q6k_rows(const float *x, const uint8_t *blocks, float *y, long rows, long n_in, long n_out, int threads,
             long many_from, int integer, int wide) {
    if (rows < 1 || n_out < 1 || n_in < Q6K_VALUES || n_in % Q6K_VALUES) return -1;
    if (threads < 1) threads = 1;
#if defined(__AVX2__) && defined(__FMA__)
    if (integer) { /* few rows in registers, many through the tiles */
        struct i8_args args;
        int many = rows >= many_from; /* the tiles take int16 rows */
        if (i8_prepare(&args, x, rows, n_in, blocks, NULL, NULL, y, n_out, n_out, BLOCK, 6, SCALE_F32, 0,
                       wide || many, many || !wide, threads))
            return -1;
        struct gemm_args g = {&args, rows, 0};
        threads = many ? (int)run_parts(gemm_part, &g, threads)
                       : for_each_tile(I8_WIDTH, I8_GROUP, rows, n_out, threads, q6k_step, &args);
        i8_release(&args);
        return atomic_load(&g.failed) ? -1 : threads;
    }
#else
    (void)many_from, (void)integer, (void)wide;
#endif
    struct many_args args = {x, blocks, NULL, NULL, y, rows, n_in, n_out, Q6K_VALUES, 8, SCALE_F32, 1, 0};
    run_parts(many_part, &args, threads);
    return atomic_load(&args.failed) ? -1 : threads;
}

/* ---- 4-bit codes stored as the tiles read them (laid out once, at load) ----------------------
 * The tiles above multiply GEMM_OUT outputs a read with no horizontal adds, but laying a tile out
 * costs about a step's worth of reads and shuffles a call: a prefill pays it once for hundreds of
 * rows, a check of a few drafted tokens cannot. So a weight of 4-bit codes (or codes a byte each)
 * on integer activations is laid out once, at load, as the tiles read it, in the same bytes as
 * MLX's (the same scales and biases in another order), and every pass multiplies it through the tiles: a step, a check
 * and a prefill of a row give the same bits (the float operations a row sees are the tiles',
 * whatever the rows beside it), and a check's extra rows cost only their own multiply-adds.
 * Layout (quant_tile_pack): per tile of GEMM_OUT outputs, per block of 32 inputs, 4 runs of 64
 * bytes; in run p, output j's 4 bytes hold inputs 8p..8p+3 (low nibbles) and 8p+4..8p+7 (high);
 * codes a byte each: 8 runs, run p output j's codes of inputs 4p..4p+3.
 * Scales and biases: per tile, per group, GEMM_OUT values (the caller transposes them). The same
 * integer sums and float operations as gemm512_rows_ on a filled tile, so a prefill's bits are
 * those of the integer tiles. AVX-512 VNNI only: elsewhere weights keep MLX's layout. */
#define TILE_RUN 64                     /* bytes of a run: GEMM_OUT outputs × 4 bytes */
#define TILE_BLOCK (4 * TILE_RUN)       /* bytes of a block of 32 inputs for GEMM_OUT outputs */
#define TILE_BYTE_BLOCK (8 * TILE_RUN)  /* the same for codes held a byte each: 8 runs of 4 inputs */
/* 5-bit codes (a GGUF file's Q5_0, MLX's 5-bit layers): their low 4 bits as the 4-bit tiles lay
 * them, then a run of their top bits: output j's 4 bytes, byte i's bit p the top bit of input
 * 8p + i, its bit 4 + p that of input 8p + 4 + i. 5 bits a code where a byte each held 8. */
#define TILE_FIVE_BLOCK (5 * TILE_RUN)

#if defined(__AVX2__) && defined(__FMA__)
/* Whether this build multiplies weights laid out as tiles (quant_tile_pack). */
int quant_tiled(void) {
#if defined(TILES)
    return 1;
#else
    return 0;
#endif
}

struct tile_pack_args {
    const uint8_t *codes;
    uint8_t *out;
    long n_in, tiles;
    int bits;
    uint8_t *scratch; /* a tile's rows as stored, per part */
};

/* A tile's bytes as stored (GEMM_OUT rows) and laid out fill the same range of the weight, so the
 * packs copy the rows aside first: `out` may be `codes` (laid out in place, at load: no second
 * copy of the weight). */
static void tile_pack_part(const void *p, long part, long parts) {
    const struct tile_pack_args *t = p;
    long first, end, blocks = t->n_in / BLOCK, row_bytes = t->bits == 4 ? t->n_in / 2 : t->n_in;
    uint8_t *rows = t->scratch + part * GEMM_OUT * row_bytes;
    part_range(t->tiles, part, parts, &first, &end);
    for (long tile = first; tile < end; tile++) {
        memcpy(rows, t->codes + tile * GEMM_OUT * row_bytes, GEMM_OUT * row_bytes);
        for (long j = 0; j < GEMM_OUT; j++) {
            const uint8_t *row = rows + j * row_bytes;
            if (t->bits == 8) { /* a code a byte: run p of a block, inputs 4p..4p+3 */
                uint8_t *out = t->out + tile * blocks * TILE_BYTE_BLOCK + 4 * j;
                for (long blk = 0; blk < blocks; blk++)
                    for (int run = 0; run < 8; run++)
                        memcpy(out + blk * TILE_BYTE_BLOCK + run * TILE_RUN, row + blk * BLOCK + 4 * run, 4);
                continue;
            }
            if (t->bits == 5) { /* a code a byte, below 32: low nibbles as 4-bit codes, then top bits */
                uint8_t *out = t->out + tile * blocks * TILE_FIVE_BLOCK + 4 * j;
                for (long blk = 0; blk < blocks; blk++) {
                    const uint8_t *code = row + blk * BLOCK;
                    uint8_t *o = out + blk * TILE_FIVE_BLOCK, top[4] = {0};
                    for (int run = 0; run < 4; run++)
                        for (int i = 0; i < 4; i++) {
                            int low = code[8 * run + i], high = code[8 * run + 4 + i];
                            o[run * TILE_RUN + i] = (uint8_t)((low & 15) | (high & 15) << 4);
                            top[i] |= (uint8_t)((low >> 4 & 1) << run | (high >> 4 & 1) << (4 + run));
                        }
                    memcpy(o + 4 * TILE_RUN, top, 4);
                }
                continue;
            }
            uint8_t *out = t->out + tile * blocks * TILE_BLOCK + 4 * j;
            for (long blk = 0; blk < blocks; blk++) {
                uint8_t code[BLOCK]; /* byte k holds codes 2k (low nibble) and 2k + 1 */
                for (int k = 0; k < BLOCK / 2; k++)
                    code[2 * k] = row[blk * BLOCK / 2 + k] & 15, code[2 * k + 1] = row[blk * BLOCK / 2 + k] >> 4;
                for (int run = 0; run < 4; run++)
                    for (int i = 0; i < 4; i++)
                        out[blk * TILE_BLOCK + run * TILE_RUN + i] = (uint8_t)(code[8 * run + i] | code[8 * run + 4 + i] << 4);
            }
        }
    }
}

/* MLX's 4-bit codes (n_out × n_in/2 bytes), or codes a byte each (bits 8: n_out × n_in), laid out as
 * tiles into `out` (as many bytes; `codes` itself for a layout in place); bits 5: codes a byte each,
 * each below 32, laid out as 5-bit tiles (n_out × n_in·5/8 bytes, never in place). 0, -1 where the
 * shape does not tile (outputs a multiple of GEMM_OUT, inputs of 32), -2 without memory for the
 * copies. */
int quant_tile_pack(const uint8_t *codes, uint8_t *out, long n_out, long n_in, int bits, int threads) {
    if (n_out % GEMM_OUT || n_in % BLOCK || n_out < 1 || (bits != 4 && bits != 5 && bits != 8)) return -1;
    long parts = threads < 1 ? 1 : threads > MAX_PARTS ? MAX_PARTS : threads;
    uint8_t *scratch = malloc(parts * GEMM_OUT * (bits == 4 ? n_in / 2 : n_in));
    if (!scratch) return -2;
    struct tile_pack_args t = {codes, out, n_in, n_out / GEMM_OUT, bits, scratch};
    run_parts(tile_pack_part, &t, parts);
    free(scratch);
    return 0;
}
#else
int quant_tiled(void) { return 0; }
int quant_tile_pack(const uint8_t *codes, uint8_t *out, long n_out, long n_in, int bits, int threads) {
    (void)codes, (void)out, (void)n_out, (void)n_in, (void)bits, (void)threads;
    return -1;
}
#endif

#if defined(TILES)
/* The tiles' kernels on GEMM_OUT lanes of int32 (ti) or fp32 (tf), lane j output j: one 512-bit
 * vector, or two of AVX2's (outputs 0-7, 8-15) with the same operations per lane. The byte
 * products sum exactly either way where the kernel takes a weight (gemm_takes: without VNNI, no
 * pair of byte products past int16), so a row gets the same bits on both. */
#if defined(GEMM_512)
typedef __m512i ti;
typedef __m512 tf;
static inline ti ti_load(const void *p) { return _mm512_loadu_si512(p); }
static inline ti ti_zero(void) { return _mm512_setzero_si512(); }
static inline ti ti_set1(int32_t x) { return _mm512_set1_epi32(x); }
static inline ti ti_set1_8(char x) { return _mm512_set1_epi8(x); }
static inline ti ti_and(ti a, ti b) { return _mm512_and_si512(a, b); }
static inline ti ti_or(ti a, ti b) { return _mm512_or_si512(a, b); }
static inline ti ti_sub(ti a, ti b) { return _mm512_sub_epi32(a, b); }
static inline ti ti_srli16(ti a, int n) { return _mm512_srli_epi16(a, n); }
static inline ti ti_slli16(ti a, int n) { return _mm512_slli_epi16(a, n); }
static inline ti ti_srli32(ti a, int n) { return _mm512_srli_epi32(a, n); }
static inline ti ti_slli32(ti a, int n) { return _mm512_slli_epi32(a, n); }
static inline ti ti_bytes(ti acc, ti u, ti s) { return _mm512_dpbusd_epi32(acc, u, s); }
static inline ti ti_pairs(ti acc, ti w, ti x) { return _mm512_dpwssd_epi32(acc, w, x); }
static inline ti ti_int8s(const void *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline tf tf_zero(void) { return _mm512_setzero_ps(); }
static inline tf tf_set1(float x) { return _mm512_set1_ps(x); }
static inline tf tf_of(ti a) { return _mm512_cvtepi32_ps(a); }
static inline tf tf_add(tf a, tf b) { return _mm512_add_ps(a, b); }
static inline tf tf_mul(tf a, tf b) { return _mm512_mul_ps(a, b); }
static inline tf tf_fmadd(tf a, tf b, tf c) { return _mm512_fmadd_ps(a, b, c); }
static inline tf tf_fnmadd(tf a, tf b, tf c) { return _mm512_fnmadd_ps(a, b, c); }
static inline void tf_store(float *p, tf a) { _mm512_storeu_ps(p, a); }
static inline tf tf_halves(const void *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* GEMM_OUT scales (or biases) of `type` from element i, as fp32. */
static inline tf load_scales16(const void *p, long i, int type) {
    if (type == SCALE_F32) return _mm512_loadu_ps((const float *)p + i);
    __m256i bits = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (type == SCALE_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    return _mm512_cvtph_ps(bits);
}
#else
typedef struct { __m256i lo, hi; } ti;
typedef struct { __m256 lo, hi; } tf;
#define TI2(EXPR_LO, EXPR_HI) ((ti){EXPR_LO, EXPR_HI})
#define TF2(EXPR_LO, EXPR_HI) ((tf){EXPR_LO, EXPR_HI})
static inline ti ti_load(const void *p) {
    return TI2(_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)((const char *)p + 32)));
}
static inline ti ti_zero(void) { return TI2(_mm256_setzero_si256(), _mm256_setzero_si256()); }
static inline ti ti_set1(int32_t x) { return TI2(_mm256_set1_epi32(x), _mm256_set1_epi32(x)); }
static inline ti ti_set1_8(char x) { return TI2(_mm256_set1_epi8(x), _mm256_set1_epi8(x)); }
static inline ti ti_and(ti a, ti b) { return TI2(_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)); }
static inline ti ti_or(ti a, ti b) { return TI2(_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)); }
static inline ti ti_sub(ti a, ti b) { return TI2(_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)); }
static inline ti ti_srli16(ti a, int n) { return TI2(_mm256_srli_epi16(a.lo, n), _mm256_srli_epi16(a.hi, n)); }
static inline ti ti_slli16(ti a, int n) { return TI2(_mm256_slli_epi16(a.lo, n), _mm256_slli_epi16(a.hi, n)); }
static inline ti ti_srli32(ti a, int n) { return TI2(_mm256_srli_epi32(a.lo, n), _mm256_srli_epi32(a.hi, n)); }
static inline ti ti_slli32(ti a, int n) { return TI2(_mm256_slli_epi32(a.lo, n), _mm256_slli_epi32(a.hi, n)); }
static inline ti ti_bytes(ti acc, ti u, ti s) { return TI2(dot_bytes(acc.lo, u.lo, s.lo), dot_bytes(acc.hi, u.hi, s.hi)); }
static inline ti ti_pairs(ti acc, ti w, ti x) { return TI2(dot_pairs(acc.lo, w.lo, x.lo), dot_pairs(acc.hi, w.hi, x.hi)); }
static inline ti ti_int8s(const void *p) {
    return TI2(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)),
               _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const char *)p + 8))));
}
static inline tf tf_zero(void) { return TF2(_mm256_setzero_ps(), _mm256_setzero_ps()); }
static inline tf tf_set1(float x) { return TF2(_mm256_set1_ps(x), _mm256_set1_ps(x)); }
static inline tf tf_of(ti a) { return TF2(_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)); }
static inline tf tf_add(tf a, tf b) { return TF2(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
static inline tf tf_mul(tf a, tf b) { return TF2(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
static inline tf tf_fmadd(tf a, tf b, tf c) {
    return TF2(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
static inline tf tf_fnmadd(tf a, tf b, tf c) {
    return TF2(_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi));
}
static inline void tf_store(float *p, tf a) { _mm256_storeu_ps(p, a.lo), _mm256_storeu_ps(p + 8, a.hi); }
static inline tf tf_halves(const void *p) {
    return TF2(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
               _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const char *)p + 16))));
}
static inline tf load_scales16(const void *p, long i, int type) {
    if (type == SCALE_F32) return TF2(_mm256_loadu_ps((const float *)p + i), _mm256_loadu_ps((const float *)p + i + 8));
    const uint16_t *h = (const uint16_t *)p + i;
    if (type == SCALE_BF16) {
        __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h));
        __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + 8)));
        return TF2(_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
    }
    return tf_halves(h);
}
#endif

/* sum[k] + a block's 4-bit tile codes (4 runs of TILE_RUN bytes) times row k's activations of
 * block u: int8 (xrow[k] as stored), or where WIDE int16 laid out as pairs (SPLIT_TILE_PAIRS), each
 * run's codes masked into 4 vectors of int16 pairs, inputs (0, 2), (1, 3), (4, 6), (5, 7) of the run.
 * Exact integer sums, so any order gives the same. */
static inline __attribute__((always_inline)) void nibble_block_sums(const uint8_t *block, const char *const *xrow,
                                                                    long u, int K, int wide, int five, ti *sum) {
    const ti mask = ti_set1_8(15), pairs = ti_set1(0x000F000F), bit4 = ti_set1_8(16);
    const ti top = five ? ti_load(block + 4 * TILE_RUN) : ti_zero(); /* 5-bit codes: their top bits */
    for (int run = 0; run < 4; run++) {
        ti v = ti_load(block + run * TILE_RUN);
        if (wide) {
            ti c[4] = {ti_and(v, pairs), ti_and(ti_srli32(v, 8), pairs), ti_and(ti_srli32(v, 4), pairs),
                       ti_and(ti_srli32(v, 12), pairs)};
            for (int k = 0; k < K; k++) {
                const char *x = xrow[k] + (u * BLOCK + 8 * run) * 2;
                for (int h = 0; h < 4; h++) {
                    int32_t lane;
                    memcpy(&lane, x + 4 * h, 4);
                    sum[k] = ti_pairs(sum[k], c[h], ti_set1(lane));
                }
            }
        } else {
            ti low = ti_and(v, mask), high = ti_and(ti_srli16(v, 4), mask);
            if (five) { /* each byte's top bit to bit 4 (TILE_FIVE_BLOCK): a code below 32 */
                low = ti_or(low, ti_and(ti_slli32(top, 4 - run), bit4));
                high = ti_or(high, ti_and(ti_srli32(top, run), bit4));
            }
            for (int k = 0; k < K; k++) {
                int32_t lo, hi;
                memcpy(&lo, xrow[k] + u * BLOCK + 8 * run, 4);
                memcpy(&hi, xrow[k] + u * BLOCK + 8 * run + 4, 4);
                sum[k] = ti_bytes(sum[k], low, ti_set1(lo));
                sum[k] = ti_bytes(sum[k], high, ti_set1(hi));
            }
        }
    }
}

/* K rows from r times tile `tile` of a laid-out weight: out (K × GEMM_OUT). Per block, per lane,
 * gemm512_rows_'s operations (WIDE: gemm512_wide_'s): the integer sum, centred, converted, times
 * s·dx; then per group (b + c·s)·Σx (c·s exact: c is a power of two). WIDE: int16 rows, each run's
 * codes masked into 4 vectors of int16 pairs, inputs (0, 2), (1, 3), (4, 6), (5, 7) of the run,
 * against x laid out to match (SPLIT_TILE_PAIRS). BYTES: codes a byte each (any below 256: VNNI's
 * byte products sum exactly in int32), 8 runs of 4 inputs a block, int8 rows. */
#define TILED_TIMES(K, WIDE, BYTES, NAME)                                                        \
    static void NAME(const struct i8_args *a, long tile, long r, float *out) {                  \
        const long block_bytes = BYTES == 1 ? TILE_BYTE_BLOCK : BYTES ? TILE_FIVE_BLOCK : TILE_BLOCK; \
        const uint8_t *w = a->w + tile * a->blocks * block_bytes;                                \
        long first = tile * a->groups * GEMM_OUT, per = a->gs / BLOCK;                           \
        tf acc[K];                                                                               \
        const char *xrow[K]; /* a row's activations, as bytes */                                 \
        for (int k = 0; k < K; k++)                                                              \
            acc[k] = tf_zero(),                                                                  \
            xrow[k] = WIDE ? (const char *)(a->xw + (r + k) * a->stride) : (const char *)(a->xq + (r + k) * a->stride); \
        for (long u = 0; u < a->blocks; u++) {                                                   \
            const uint8_t *block = w + u * block_bytes;                                          \
            for (int line = 0; line < (BYTES == 1 ? 8 : BYTES ? 5 : 4); line++) prefetch(block + PREFETCH_BYTES + 64 * line); \
            ti sum[K]; /* each starts at the centre's part, -c·Σ xq: the same integers, one op less */ \
            for (int k = 0; k < K; k++) sum[k] = ti_set1(-(a->xqsum[(r + k) * a->padded + u] << a->centre)); \
            for (int run = 0; BYTES == 1 && run < 8; run++) {                                         \
                ti v = ti_load(block + run * TILE_RUN);                                          \
                for (int k = 0; k < K; k++) {                                                    \
                    int32_t lane;                                                                \
                    memcpy(&lane, xrow[k] + u * BLOCK + 4 * run, 4);                             \
                    sum[k] = ti_bytes(sum[k], v, ti_set1(lane));                                 \
                }                                                                                \
            }                                                                                    \
            if (BYTES != 1) nibble_block_sums(block, xrow, u, K, WIDE, BYTES == 2, sum);          \
            tf scale = load_scales16(a->scales, first + (u / per) * GEMM_OUT, a->type);          \
            for (int k = 0; k < K; k++)                                                          \
                acc[k] = tf_fmadd(tf_of(sum[k]), tf_mul(scale, tf_set1(a->dx[(r + k) * a->padded + u])), acc[k]); \
        }                                                                                        \
        const tf centre = tf_set1((float)(1 << a->centre));                                     \
        for (long g = 0; g < a->groups; g++) {                                                   \
            tf s = load_scales16(a->scales, first + g * GEMM_OUT, a->type);                      \
            tf bias = tf_add(load_scales16(a->biases, first + g * GEMM_OUT, a->type), tf_mul(centre, s)); \
            for (int k = 0; k < K; k++)                                                          \
                acc[k] = tf_fmadd(bias, tf_set1(a->xsum[(r + k) * a->groups + g]), acc[k]);      \
        }                                                                                        \
        for (int k = 0; k < K; k++) tf_store(out + k * GEMM_OUT, acc[k]);                        \
    }
/* A tile kernel of each row count up to TILE_ROWS: MAKE(K, WIDE, PREFIX##K) for K = 1.., and the
 * table of them (TILE_ROW_FNS), for every kind of tile (4-bit and byte codes, Q4_K, Q6_K). */
#if TILE_ROWS == 8
#define TILE_ROW_KERNELS(MAKE, WIDE, P)                                                          \
    MAKE(1, WIDE, P##1) MAKE(2, WIDE, P##2) MAKE(3, WIDE, P##3) MAKE(4, WIDE, P##4)               \
    MAKE(5, WIDE, P##5) MAKE(6, WIDE, P##6) MAKE(7, WIDE, P##7) MAKE(8, WIDE, P##8)
#define TILE_ROW_FNS(P) {0, P##1, P##2, P##3, P##4, P##5, P##6, P##7, P##8}
#elif TILE_ROWS == 4
#define TILE_ROW_KERNELS(MAKE, WIDE, P) MAKE(1, WIDE, P##1) MAKE(2, WIDE, P##2) MAKE(3, WIDE, P##3) MAKE(4, WIDE, P##4)
#define TILE_ROW_FNS(P) {0, P##1, P##2, P##3, P##4}
#else
#define TILE_ROW_KERNELS(MAKE, WIDE, P) MAKE(1, WIDE, P##1) MAKE(2, WIDE, P##2)
#define TILE_ROW_FNS(P) {0, P##1, P##2}
#endif
#define TILED_CODES(K, WIDE, NAME) TILED_TIMES(K, WIDE, 0, NAME) /* 4-bit codes */
#define TILED_BYTES(K, WIDE, NAME) TILED_TIMES(K, WIDE, 1, NAME) /* codes a byte each */
#define TILED_FIVE(K, WIDE, NAME) TILED_TIMES(K, WIDE, 2, NAME)  /* 5-bit codes (TILE_FIVE_BLOCK) */
TILE_ROW_KERNELS(TILED_CODES, 0, tiled_rows_)
TILE_ROW_KERNELS(TILED_CODES, 1, tiled_wide_)
TILE_ROW_KERNELS(TILED_BYTES, 0, tiled_bytes_)
TILE_ROW_KERNELS(TILED_FIVE, 0, tiled_five_)

typedef void (*tiled_fn)(const struct i8_args *, long, long, float *);
static const tiled_fn TILED_FN[4][TILE_ROWS + 1] = {TILE_ROW_FNS(tiled_rows_), TILE_ROW_FNS(tiled_wide_),
                                                   TILE_ROW_FNS(tiled_bytes_), TILE_ROW_FNS(tiled_five_)};

/* ---- Q4_K blocks stored as the tiles read them (laid out once, at load) -----------------------
 * A GGUF file's Q4_K weights (most of a Q4_K_M model's) read as stored, 4.5 bits a weight, where
 * an MLX affine copy holds an fp16 scale and bias per 32 (5 bits): per tile of GEMM_OUT outputs and
 * block of 256 inputs, Q4K_TILE bytes, as many as the outputs' blocks. First the blocks' 12 bytes of
 * 6-bit scales and mins as 3 runs (run k: output j's bytes 4k..4k+3), then GEMM_OUT fp16 d's and
 * GEMM_OUT fp16 dmin's (Q4K_TILE_META); then per 32 inputs, 4 runs of nibbles as the 4-bit tiles
 * lay them. The scales ahead of the codes they scale, a tile is read front to back: checks of 3-6
 * rows 9-20% faster than with them behind (the kernel alone, in one process). Per 32 inputs
 * W = (d·sc)·q - (dmin·m) (ggml's dequantize_row_q4_K): a row's codes times xq are summed exactly in
 * int32, converted and scaled by (d·sc)·dx, less (dmin·m)·Σx. Weight fields: type SCALE_Q4K, group
 * 32, the tiles as codes (scales and biases unread). */
#define Q4K_VALUES 256
#define Q4K_BYTES 144
#define Q4K_TILE (GEMM_OUT * Q4K_BYTES)  /* 2304 */
#define Q4K_TILE_CODES (8 * TILE_BLOCK)  /* 2048: 8 blocks of 32 */
#define Q4K_TILE_META (Q4K_TILE - Q4K_TILE_CODES) /* 256: scales and mins, d's, dmin's */

/* Sub-block blk's 6-bit scale and min of each lane, from its 12 bytes as three runs (ggml's
 * get_scale_min_k4 on each lane's bytes: run 0 bytes 0-3, run 1 4-7, run 2 8-11). */
static inline __attribute__((always_inline)) void q4k_scale_min(ti s0, ti s1, ti s2, int blk, ti *sc, ti *m) {
    const ti six = ti_set1(63), four = ti_set1(15), two = ti_set1(3);
    if (blk < 4) {
        *sc = ti_and(ti_srli32(s0, 8 * blk), six);
        *m = ti_and(ti_srli32(s1, 8 * blk), six);
    } else {
        int i = blk - 4;
        *sc = ti_or(ti_and(ti_srli32(s2, 8 * i), four), ti_slli32(ti_and(ti_srli32(s0, 8 * i + 6), two), 4));
        *m = ti_or(ti_and(ti_srli32(s2, 8 * i + 4), four), ti_slli32(ti_and(ti_srli32(s1, 8 * i + 6), two), 4));
    }
}

/* K rows from r times Q4_K tile `tile`: out (K × GEMM_OUT); WIDE: int16 rows as the 4-bit wide
 * tiles take them. Each superblock asks for the same bytes of the next one (codes and scales). */
#define TILED_Q4K(K, WIDE, NAME)                                                                 \
    static void NAME(const struct i8_args *a, long tile, long r, float *out) {                  \
        long superblocks = a->n_in / Q4K_VALUES;                                                 \
        tf acc[K];                                                                               \
        const char *xrow[K];                                                                     \
        for (int k = 0; k < K; k++)                                                              \
            acc[k] = tf_zero(),                                                                  \
            xrow[k] = WIDE ? (const char *)(a->xw + (r + k) * a->stride) : (const char *)(a->xq + (r + k) * a->stride); \
        for (long sb = 0; sb < superblocks; sb++) {                                              \
            const uint8_t *meta = a->w + (tile * superblocks + sb) * Q4K_TILE, *base = meta + Q4K_TILE_META; \
            for (int line = 0; line < 4; line++) prefetch(meta + Q4K_TILE + 64 * line);           \
            tf d = tf_halves(meta + 3 * TILE_RUN), dmin = tf_halves(meta + 3 * TILE_RUN + 2 * GEMM_OUT); \
            ti s0 = ti_load(meta), s1 = ti_load(meta + TILE_RUN), s2 = ti_load(meta + 2 * TILE_RUN); \
            for (int blk = 0; blk < 8; blk++) {                                                  \
                const uint8_t *block = base + blk * TILE_BLOCK;                                  \
                for (int line = 0; line < 4; line++) prefetch(block + Q4K_TILE + 64 * line);      \
                long u = sb * 8 + blk; /* the row's block of 32 */                               \
                ti sum[K];                                                                       \
                for (int k = 0; k < K; k++) sum[k] = ti_zero();                                  \
                nibble_block_sums(block, xrow, u, K, WIDE, 0, sum);                              \
                ti sc, m;                                                                        \
                q4k_scale_min(s0, s1, s2, blk, &sc, &m);                                         \
                tf scale = tf_mul(tf_of(sc), d), low = tf_mul(tf_of(m), dmin);                   \
                for (int k = 0; k < K; k++) {                                                    \
                    acc[k] = tf_fmadd(tf_of(sum[k]), tf_mul(scale, tf_set1(a->dx[(r + k) * a->padded + u])), acc[k]); \
                    acc[k] = tf_fnmadd(low, tf_set1(a->xsum[(r + k) * a->groups + u]), acc[k]);  \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < K; k++) tf_store(out + k * GEMM_OUT, acc[k]);                        \
    }
TILE_ROW_KERNELS(TILED_Q4K, 0, tiled_q4k_)
TILE_ROW_KERNELS(TILED_Q4K, 1, tiled_q4k_wide_)
static const tiled_fn TILED_Q4K_FN[2][TILE_ROWS + 1] = {TILE_ROW_FNS(tiled_q4k_), TILE_ROW_FNS(tiled_q4k_wide_)};

struct tiled_many_args {
    long count, rows;
    long first[MANY_WEIGHTS + 1]; /* weight i's tiles are first[i]..first[i + 1] - 1 of the call's */
    struct i8_args weights[MANY_WEIGHTS];
    atomic_long next; /* the next tile no thread has taken (next_items) */
};

/* Tiles lo..hi - 1 of a call of quant_tiled_rows (across its weights). */
static void tiled_tiles(const struct tiled_many_args *m, long lo, long hi) {
    float out[TILE_ROWS * GEMM_OUT];
    for (long i = 0; i < m->count; i++) {
        const struct i8_args *a = &m->weights[i];
        long from = lo > m->first[i] ? lo : m->first[i], to = hi < m->first[i + 1] ? hi : m->first[i + 1];
        for (long tile = from - m->first[i]; tile < to - m->first[i]; tile++)
            for (long r = 0; r < m->rows; r += TILE_ROWS) {
                long k = m->rows - r < TILE_ROWS ? m->rows - r : TILE_ROWS;
                (a->type == SCALE_Q4K ? TILED_Q4K_FN[a->wide] : TILED_FN[a->bits == 8 ? 2 : a->bits == 5 ? 3 : a->wide])[k](a, tile, r, out);
                for (long rr = 0; rr < k; rr++)
                    memcpy(a->y + (r + rr) * a->y_stride + tile * GEMM_OUT, out + rr * GEMM_OUT,
                           sizeof(float) * GEMM_OUT);
            }
    }
}

static void tiled_part(const void *p, long part, long parts) {
    struct tiled_many_args *m = (struct tiled_many_args *)p; /* the call's own: its counter moves */
    long lo, hi, total = m->first[m->count], chunk = share_chunk(total, parts);
    (void)part;
    while (next_items(&m->next, total, chunk, &lo, &hi)) tiled_tiles(m, lo, hi);
}
#endif

/* y (rows × Σ n_out) = x (rows × n_in) · [W_0 … W_count-1]ᵀ on int8 activations (int16: wide, 4-bit
 * codes only), each W a weight of 4-bit codes or codes a byte each laid out by quant_tile_pack (its scales and biases transposed per tile), y holding their
 * outputs side by side; any number of rows, each row's bits independent of the others and of the
 * threads. Returns the threads used; -1 where a weight does not tile, on no memory, or in a build
 * without tiles (quant_tiled). */
int quant_tiled_rows(const float *x, float *y, long rows, long n_in, int threads, long count,
                     const struct quant_weight *w, int wide) {
#if defined(TILES)
    if (count < 1 || count > MANY_WEIGHTS || rows < 1) return -1;
    struct tiled_many_args m = {count, rows, {0}, {{0}}, 0};
    long total = 0;
    for (long i = 0; i < count; i++) {
        int bytes = w[i].bits == 5 ? 8 : w[i].bits; /* 5-bit tiles sum as codes a byte each do */
        int q4k = w[i].type == SCALE_Q4K, takes = q4k ? w[i].bits == 4 && w[i].gs == BLOCK && n_in % Q4K_VALUES == 0
                                                      : i8_takes(bytes, w[i].centre, w[i].biases, w[i].gs,
                                                                 w[i].type, n_in);
        if (!(w[i].bits == 4 || (bytes == 8 && !wide)) || !gemm_takes(bytes, w[i].centre, wide) || !takes ||
            w[i].n_out < 1 || w[i].n_out % GEMM_OUT)
            return -1;
        m.first[i + 1] = m.first[i] + w[i].n_out / GEMM_OUT;
        total += w[i].n_out;
    }
    int rounds[MANY_WEIGHTS]; /* x's rows rounded once per group size */
    for (long i = 0, done = 0; i < count; done += w[i].n_out, i++) {
        long same = 0;
        while (same < i && w[same].gs != w[i].gs) same++;
        rounds[i] = same == i;
        if (!rounds[i]) {
            struct i8_args *a = &m.weights[i];
            *a = m.weights[same];
            a->w = w[i].codes, a->scales = w[i].scales, a->biases = w[i].biases;
            a->y = y + done, a->n_out = w[i].n_out, a->type = w[i].type, a->centre = w[i].centre;
            a->bits = w[i].bits;
        } else if (i8_prepare(&m.weights[i], x, rows, n_in, w[i].codes, w[i].scales, w[i].biases, y + done, total,
                              w[i].n_out, w[i].gs, w[i].bits, w[i].type, w[i].centre, wide, 2, threads)) {
            while (i-- > 0)
                if (rounds[i]) i8_release(&m.weights[i]);
            return -1;
        }
    }
    threads = (int)run_parts(tiled_part, &m, threads < 1 ? 1 : threads);
    for (long i = 0; i < count; i++)
        if (rounds[i]) i8_release(&m.weights[i]);
    return threads;
#else
    (void)x, (void)y, (void)rows, (void)n_in, (void)threads, (void)count, (void)w, (void)wide;
    return -1;
#endif
}

/* ---- Q6_K blocks stored as the tiles read them (laid out once, at load) -----------------------
 * As the 4-bit tiles, for a GGUF file's Q6_K weights (an output head, down projections): per tile
 * of GEMM_OUT outputs and block of 256 inputs, Q6K_TILE bytes, as many as the outputs' Q6_K blocks
 * hold (6.5625 bits a weight). First 16 int8 scales a lane (one per 16 inputs: [sub-block][output])
 * and GEMM_OUT fp16 d's (Q6K_TILE_META: ahead of the codes, so that a tile is read front to back);
 * then per 32 inputs, 4 runs of 64 bytes of low nibbles as the 4-bit tiles lay them, then two of
 * high bits (a byte of output j and input i of a run holds the 4 runs' top 2 bits of the code in
 * that byte's low nibble, then of the high one: run p's at bits 2p, 2p + 1). A
 * row's codes times x per 16 inputs are summed exactly in int32, less 32·Σ x, converted and
 * scaled by (d·scale)·dx. */
#define Q6K_TILE (GEMM_OUT * Q6K_BYTES)   /* 3360 */
#define Q6K_TILE_CODES (8 * 6 * TILE_RUN) /* 3072: 8 blocks of 32, 6 runs of 64 bytes each */
#define Q6K_TILE_META (Q6K_TILE - Q6K_TILE_CODES) /* 288: the scales, then the d's */

#if defined(__AVX2__) && defined(__FMA__)
/* Lays row j's block (as stored) of a tile's GEMM_OUT rows into the tile's 256 inputs at `out`. */
typedef void (*lay_block_fn)(const uint8_t *block, uint8_t *out, long j);

struct blocks_pack_args {
    const uint8_t *blocks;
    uint8_t *out;
    long superblocks, tiles, block_bytes;
    uint8_t *scratch; /* a tile's rows of blocks as stored, per part */
    lay_block_fn lay;
};

/* As tile_pack_part: a tile's rows are copied aside first (`out` may be `blocks`); each tile's 256
 * inputs are zeroed, then every row's block laid in. */
static void blocks_pack_part(const void *p, long part, long parts) {
    const struct blocks_pack_args *t = p;
    long first, end, sb_bytes = GEMM_OUT * t->block_bytes, tile_bytes = sb_bytes * t->superblocks;
    uint8_t *rows = t->scratch + part * tile_bytes;
    part_range(t->tiles, part, parts, &first, &end);
    for (long tile = first; tile < end; tile++) {
        memcpy(rows, t->blocks + tile * tile_bytes, tile_bytes);
        for (long sb = 0; sb < t->superblocks; sb++) {
            uint8_t *out = t->out + (tile * t->superblocks + sb) * sb_bytes;
            memset(out, 0, sb_bytes);
            for (long j = 0; j < GEMM_OUT; j++) t->lay(rows + (j * t->superblocks + sb) * t->block_bytes, out, j);
        }
    }
}

/* A weight's GGUF blocks of 256 inputs (n_out × n_in/256 of block_bytes) laid out as tiles into
 * `out` (as many bytes; `blocks` itself for a layout in place), `lay` a block at a time: 0, -1 where
 * the shape does not tile (outputs a multiple of GEMM_OUT), -2 without memory for the copies. */
static int blocks_tile_pack(const uint8_t *blocks, uint8_t *out, long n_out, long n_in, long block_bytes,
                            lay_block_fn lay, int threads) {
    if (n_out % GEMM_OUT || n_in % Q6K_VALUES || n_out < 1) return -1;
    long parts = threads < 1 ? 1 : threads > MAX_PARTS ? MAX_PARTS : threads;
    uint8_t *scratch = malloc(parts * GEMM_OUT * (n_in / Q6K_VALUES) * block_bytes);
    if (!scratch) return -2;
    struct blocks_pack_args t = {blocks, out, n_in / Q6K_VALUES, n_out / GEMM_OUT, block_bytes, scratch, lay};
    run_parts(blocks_pack_part, &t, parts);
    free(scratch);
    return 0;
}

/* A Q6_K block as its tile's lane j (the layout above). */
static void q6k_lay_block(const uint8_t *block, uint8_t *out, long j) {
    uint8_t *meta = out;
    out += Q6K_TILE_META;
    uint8_t code[Q6K_VALUES]; /* the block's codes in the values' natural order */
    for (int n = 0; n < 2; n++) /* as q6k_dequantize_tile reads a half */
        for (int l = 0; l < 32; l++) {
            const uint8_t *ql = block + 64 * n, h = block[128 + 32 * n + l];
            code[128 * n + l] = (uint8_t)((ql[l] & 15) | (h & 3) << 4);
            code[128 * n + l + 32] = (uint8_t)((ql[l + 32] & 15) | ((h >> 2) & 3) << 4);
            code[128 * n + l + 64] = (uint8_t)((ql[l] >> 4) | ((h >> 4) & 3) << 4);
            code[128 * n + l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((h >> 6) & 3) << 4);
        }
    for (int blk = 0; blk < 8; blk++)
        for (int run = 0; run < 4; run++)
            for (int i = 0; i < 4; i++) {
                int low = code[32 * blk + 8 * run + i], high = code[32 * blk + 8 * run + 4 + i];
                uint8_t *codes = out + blk * 6 * TILE_RUN;
                codes[run * TILE_RUN + 4 * j + i] = (uint8_t)((low & 15) | (high & 15) << 4);
                codes[4 * TILE_RUN + 4 * j + i] |= (uint8_t)((low >> 4) << (2 * run));
                codes[5 * TILE_RUN + 4 * j + i] |= (uint8_t)((high >> 4) << (2 * run));
            }
    for (int s = 0; s < 16; s++) meta[s * GEMM_OUT + j] = block[192 + s];
    memcpy(meta + 16 * GEMM_OUT + 2 * j, block + 208, 2);
}

/* A Q6_K weight's blocks (n_out × n_in/256 of Q6K_BYTES) laid out as tiles (blocks_tile_pack). */
int quant_q6k_tile_pack(const uint8_t *blocks, uint8_t *out, long n_out, long n_in, int threads) {
    return blocks_tile_pack(blocks, out, n_out, n_in, Q6K_BYTES, q6k_lay_block, threads);
}

#if defined(TILES)
/* A Q4_K block as its tile's lane j (the layout at TILED_Q4K). A Q4_K block: fp16 d, fp16 dmin, 12
 * bytes of scales and mins, 128 of codes (byte l of 32p.. holds value l of sub-block 2p in its low
 * nibble, of 2p + 1 in its high one). */
static void q4k_lay_block(const uint8_t *block, uint8_t *out, long j) {
    const uint8_t *qs = block + 16;
    uint8_t *meta = out;
    out += Q4K_TILE_META;
    uint8_t code[Q4K_VALUES]; /* the block's codes in the values' natural order */
    for (int pair = 0; pair < 4; pair++)
        for (int l = 0; l < 32; l++) {
            code[64 * pair + l] = qs[32 * pair + l] & 15;
            code[64 * pair + 32 + l] = qs[32 * pair + l] >> 4;
        }
    for (int blk = 0; blk < 8; blk++)
        for (int run = 0; run < 4; run++)
            for (int i = 0; i < 4; i++)
                out[blk * TILE_BLOCK + run * TILE_RUN + 4 * j + i] =
                    (uint8_t)(code[32 * blk + 8 * run + i] | code[32 * blk + 8 * run + 4 + i] << 4);
    for (int k = 0; k < 3; k++) memcpy(meta + k * TILE_RUN + 4 * j, block + 4 + 4 * k, 4);
    memcpy(meta + 3 * TILE_RUN + 2 * j, block, 2);                    /* d */
    memcpy(meta + 3 * TILE_RUN + 2 * GEMM_OUT + 2 * j, block + 2, 2); /* dmin */
}

/* A Q4_K weight's blocks (n_out × n_in/256 of Q4K_BYTES) laid out as tiles (blocks_tile_pack). */
int quant_q4k_tile_pack(const uint8_t *blocks, uint8_t *out, long n_out, long n_in, int threads) {
    return blocks_tile_pack(blocks, out, n_out, n_in, Q4K_BYTES, q4k_lay_block, threads);
}
#endif
#else
int quant_q6k_tile_pack(const uint8_t *blocks, uint8_t *out, long n_out, long n_in, int threads) {
    (void)blocks, (void)out, (void)n_out, (void)n_in, (void)threads;
    return -1;
}
#endif

#if defined(TILES)
/* Σ of each 16 rounded inputs of each row (rows × n_in/16), for the codes' centre 32. */
static int32_t *sums_of_16(const struct i8_args *a, long rows) {
    long n16 = a->n_in / 16;
    int32_t *sums = malloc(sizeof(int32_t) * rows * n16);
    if (!sums) return NULL;
    for (long r = 0; r < rows; r++)
        for (long s = 0; s < n16; s++) {
            int32_t total = 0;
            for (int i = 0; i < 16; i++)
                total += a->wide ? a->xw[r * a->stride + 16 * s + i] : a->xq[r * a->stride + 16 * s + i];
            sums[r * n16 + s] = total;
        }
    return sums;
}

/* K rows from r times Q6_K tile `tile`: out (K × GEMM_OUT). WIDE: int16 rows (pairs as the 4-bit
 * wide tiles take them). xq16: sums_of_16. */
#define TILED_Q6K(K, WIDE, NAME)                                                                 \
    static void NAME(const struct i8_args *a, const int32_t *xq16, long tile, long r, float *out) { \
        long superblocks = a->n_in / Q6K_VALUES, n16 = a->n_in / 16;                             \
        tf acc[K];                                                                               \
        const char *xrow[K];                                                                     \
        for (int k = 0; k < K; k++)                                                              \
            acc[k] = tf_zero(),                                                                  \
            xrow[k] = WIDE ? (const char *)(a->xw + (r + k) * a->stride) : (const char *)(a->xq + (r + k) * a->stride); \
        const ti mask = ti_set1_8(15), top = ti_set1_8(0x30), pairs = ti_set1(0x00FF00FF);      \
        for (long sb = 0; sb < superblocks; sb++) {                                              \
            const uint8_t *meta = a->w + (tile * superblocks + sb) * Q6K_TILE, *base = meta + Q6K_TILE_META; \
            tf d = tf_halves(meta + 16 * GEMM_OUT);                                              \
            for (int blk = 0; blk < 8; blk++) {                                                  \
                const uint8_t *codes = base + blk * 6 * TILE_RUN;                                \
                for (int line = 0; line < 6; line++) prefetch(codes + Q6K_PREFETCH_BYTES + 64 * line); \
                long u = sb * 8 + blk; /* the row's block of 32 */                               \
                ti hl = ti_load(codes + 4 * TILE_RUN), hh = ti_load(codes + 5 * TILE_RUN);       \
                /* A half (16 inputs, runs 2·half and 2·half + 1) at a time, summed and scaled    \
                 * before the next: K sums live, not 2K (with K = 8 and AVX-512's 32 registers,   \
                 * 2K spilled). The same integers and float operations in the same order. */      \
                for (int half = 0; half < 2; half++) {                                           \
                    ti sum[K]; /* starts at -32·Σ of the half's 16 xq: centred as it sums */      \
                    for (int k = 0; k < K; k++) sum[k] = ti_set1(-xq16[(r + k) * n16 + 2 * u + half] * 32); \
                    for (int run = 2 * half; run < 2 * half + 2; run++) {                        \
                        ti v = ti_load(codes + run * TILE_RUN);                                  \
                        /* The run's top 2 bits of each code to bits 4-5: one shift (left by 4 - 2·run, \
                         * or right by 2 for run 3), the mask keeping each byte's own bits. */    \
                        ti hl4 = run == 3 ? ti_srli16(hl, 2) : ti_slli16(hl, 4 - 2 * run);       \
                        ti hh4 = run == 3 ? ti_srli16(hh, 2) : ti_slli16(hh, 4 - 2 * run);       \
                        ti lo = ti_or(ti_and(v, mask), ti_and(hl4, top));                        \
                        ti hi = ti_or(ti_and(ti_srli16(v, 4), mask), ti_and(hh4, top));          \
                        for (int h = 0; WIDE && h < 4; h++) { /* a pair vector at a time: AVX2's 16 registers */ \
                            ti c = ti_and(h < 2 ? (h ? ti_srli32(lo, 8) : lo) : (h == 3 ? ti_srli32(hi, 8) : hi), pairs); \
                            for (int k = 0; k < K; k++) {                                        \
                                int32_t lane;                                                    \
                                memcpy(&lane, xrow[k] + (u * BLOCK + 8 * run) * 2 + 4 * h, 4);   \
                                sum[k] = ti_pairs(sum[k], c, ti_set1(lane));                     \
                            }                                                                    \
                        }                                                                        \
                        if (!WIDE) {                                                             \
                            for (int k = 0; k < K; k++) {                                        \
                                int32_t l4, h4;                                                  \
                                memcpy(&l4, xrow[k] + u * BLOCK + 8 * run, 4);                   \
                                memcpy(&h4, xrow[k] + u * BLOCK + 8 * run + 4, 4);               \
                                sum[k] = ti_bytes(sum[k], lo, ti_set1(l4));                      \
                                sum[k] = ti_bytes(sum[k], hi, ti_set1(h4));                      \
                            }                                                                    \
                        }                                                                        \
                    }                                                                            \
                    tf scale = tf_mul(tf_of(ti_int8s(meta + (2 * blk + half) * GEMM_OUT)), d);   \
                    for (int k = 0; k < K; k++) {                                                \
                        tf step = tf_mul(scale, tf_set1(a->dx[(r + k) * a->padded + u]));        \
                        acc[k] = tf_fmadd(tf_of(sum[k]), step, acc[k]);                          \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int k = 0; k < K; k++) tf_store(out + k * GEMM_OUT, acc[k]);                        \
    }
TILE_ROW_KERNELS(TILED_Q6K, 0, tiled_q6k_)
TILE_ROW_KERNELS(TILED_Q6K, 1, tiled_q6k_wide_)
typedef void (*tiled_q6k_fn)(const struct i8_args *, const int32_t *, long, long, float *);
static const tiled_q6k_fn TILED_Q6K_FN[2][TILE_ROWS + 1] = {TILE_ROW_FNS(tiled_q6k_), TILE_ROW_FNS(tiled_q6k_wide_)};

struct tiled_q6k_args {
    const struct i8_args *a;
    const int32_t *xq16;
    long rows;
    atomic_long next; /* the next tile no thread has taken (next_items) */
};

static void tiled_q6k_part(const void *p, long part, long parts) {
    struct tiled_q6k_args *t = (struct tiled_q6k_args *)p; /* the call's own: its counter moves */
    const struct i8_args *a = t->a;
    long lo, hi, tiles = a->n_out / GEMM_OUT, chunk = share_chunk(tiles, parts);
    float out[TILE_ROWS * GEMM_OUT];
    (void)part;
    while (next_items(&t->next, tiles, chunk, &lo, &hi))
        for (long tile = lo; tile < hi; tile++)
            for (long r = 0; r < t->rows; r += TILE_ROWS) {
                long k = t->rows - r < TILE_ROWS ? t->rows - r : TILE_ROWS;
                TILED_Q6K_FN[a->wide][k](a, t->xq16, tile, r, out);
                for (long rr = 0; rr < k; rr++)
                    memcpy(a->y + (r + rr) * a->y_stride + tile * GEMM_OUT, out + rr * GEMM_OUT,
                           sizeof(float) * GEMM_OUT);
            }
}
#endif

/* y (rows × n_out) = x (rows × n_in) · Wᵀ for a Q6_K weight laid out by quant_q6k_tile_pack, on
 * int8 activations (int16: wide), any number of rows, each row's bits independent of the others
 * and of the threads. Returns the threads used; -1 where the shape does not tile, on no memory,
 * or in a build without tiles (quant_tiled). */
int quant_tiled_q6k(const float *x, const uint8_t *tiles, float *y, long rows, long n_in, long n_out, int threads,
                    int wide) {
#if defined(TILES)
    if (rows < 1 || n_out < 1 || n_out % GEMM_OUT || n_in % Q6K_VALUES) return -1;
    struct i8_args args;
    if (i8_prepare(&args, x, rows, n_in, tiles, NULL, NULL, y, n_out, n_out, BLOCK, 6, SCALE_F32, 0, wide, 2, threads))
        return -1;
    int32_t *xq16 = sums_of_16(&args, rows);
    if (!xq16) {
        i8_release(&args);
        return -1;
    }
    struct tiled_q6k_args t = {&args, xq16, rows, 0};
    threads = (int)run_parts(tiled_q6k_part, &t, threads < 1 ? 1 : threads);
    free(xq16);
    i8_release(&args);
    return threads;
#else
    (void)x, (void)tiles, (void)y, (void)rows, (void)n_in, (void)n_out, (void)threads, (void)wide;
    return -1;
#endif
}

#if !defined(TILES)
int quant_q4k_tile_pack(const uint8_t *blocks, uint8_t *out, long n_out, long n_in, int threads) {
    (void)blocks, (void)out, (void)n_out, (void)n_in, (void)threads;
    return -1;
}
#endif
