/* A decoding pass's small operations between the quantized products (pass_ops.py): RMSNorm, RoPE,
 * attention over the keys each query sees, and silu(gate)·up, one call each for a pass's rows.
 *
 * Why our own: in NumPy each is several array operations of a few microseconds, and a decoding
 * step of the Qwen 1.5B made ~1,500 of them (~8 ms of an ~80 ms step; a check of 8 rows, whose
 * attention went a query at a time, ~20 ms). Every row is computed alone, in one fixed order, so
 * a row's bits do not depend on the rows beside it (a check's rows are a step's).
 *
 * Compiled with -ffp-contract=off: RMSNorm and RoPE then make NumPy's float operations in NumPy's
 * order (its pairwise sum of the squares), the same bits; attention and silu take their own
 * exponential and summation order, within fp32 rounding of NumPy's (checked on first use). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int pass_ops_version(void) { return 1; }

/* NumPy's pairwise sum of n contiguous floats (its float add.reduce): blocks of up to 128 summed
 * in 8 lanes, halves (multiples of 8) summed apart and added. */
static float pairwise_sum(const float *a, long n) {
    if (n < 8) {
        float sum = 0.0f;
        for (long i = 0; i < n; i++) sum += a[i];
        return sum;
    }
    if (n <= 128) {
        float r[8];
        long i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        float sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) sum += a[i];
        return sum;
    }
    long half = n / 2;
    half -= half % 8;
    return pairwise_sum(a, half) + pairwise_sum(a + half, n - half);
}

/* out = x / sqrt(mean(x²) + eps) · w, row by row (x and out: rows × dims, contiguous). */
int rms_norm_rows(const float *x, const float *w, float eps, float *out, long rows, long dims) {
    float *squares = malloc(sizeof(float) * (size_t)dims);
    if (!squares) return -1;
    for (long r = 0; r < rows; r++) {
        const float *row = x + r * dims;
        float *to = out + r * dims;
        for (long i = 0; i < dims; i++) squares[i] = row[i] * row[i];
        float mean = pairwise_sum(squares, dims) / (float)dims;
        float root = sqrtf(mean + eps);
        for (long i = 0; i < dims; i++) {
            float scaled = row[i] / root;
            to[i] = scaled * w[i];
        }
    }
    free(squares);
    return 1;
}

/* RoPE as nn.RoPE: x (B × H × L × D, element strides sb, sh, sl; D contiguous) rotated at the
 * angles whose cos and sin are given per (sequence, position) (tables B or 1 × L × half, cb: the
 * sequence stride, 0 for one table) into out (B × H × L × D, contiguous); dims past rope_dims are
 * copied. traditional: neighbours paired, else the first half of the rotated dims with the second. */
int rope_rows(const float *x, long sb, long sh, long sl, long batch, long heads, long length, long dim,
              long rope_dims, int traditional, const float *cos_t, const float *sin_t, long cb, float *out) {
    long half = rope_dims / 2;
    for (long b = 0; b < batch; b++)
        for (long h = 0; h < heads; h++)
            for (long l = 0; l < length; l++) {
                const float *in = x + b * sb + h * sh + l * sl;
                const float *c = cos_t + b * cb + l * half, *s = sin_t + b * cb + l * half;
                float *to = out + ((b * heads + h) * length + l) * dim;
                memcpy(to, in, sizeof(float) * (size_t)dim);
                for (long i = 0; i < half; i++) {
                    long first = traditional ? 2 * i : i, second = traditional ? 2 * i + 1 : i + half;
                    float a = in[first], e = in[second];
                    float ac = a * c[i], es = e * s[i], as = a * s[i], ec = e * c[i];
                    to[first] = ac - es;
                    to[second] = as + ec;
                }
            }
    return 1;
}

/* e^x in place for n floats: Cephes' expf (a degree-6 polynomial on x - k·ln 2, times 2^k), 16
 * at a time in the compiler's vector types (the tail through a padded block: the same operations,
 * so an element's value does not depend on where it sits); within ~2 ulp of the exact value,
 * inputs clamped to [-87, 88]. */
typedef float floats16 __attribute__((vector_size(64)));
typedef int32_t ints16 __attribute__((vector_size(64)));

static inline floats16 exp16(floats16 v) {
    const floats16 low = {0}, round = low + 12582912.0f; /* 1.5·2^23: adding it rounds to an integer */
    ints16 under = v < -87.0f, over = v > 88.0f; /* lanes all ones where true */
    v = (floats16)(((ints16)v & ~(under | over)) | ((ints16)(low - 87.0f) & under) | ((ints16)(low + 88.0f) & over));
    floats16 k = v * 1.44269504088896341f;
    k = (k + round) - round;
    floats16 r = v - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    floats16 p = low + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    ints16 bits = (__builtin_convertvector(k, ints16) + 127) << 23;
    return p * (floats16)bits;
}

static void exp_in_place(float *x, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        floats16 v;
        memcpy(&v, x + i, sizeof v);
        v = exp16(v);
        memcpy(x + i, &v, sizeof v);
    }
    if (i < n) {
        floats16 v = {0};
        memcpy(&v, x + i, sizeof(float) * (size_t)(n - i));
        v = exp16(v);
        memcpy(x + i, &v, sizeof(float) * (size_t)(n - i));
    }
}

/* The sum of a vector's 16 lanes, halves added pairwise: one fixed order. */
static inline float lanes_sum(floats16 v) {
    float part[16];
    memcpy(part, &v, sizeof part);
    for (int width = 8; width > 0; width /= 2)
        for (int j = 0; j < width; j++) part[j] += part[j + width];
    return part[0];
}

/* Σ a[i]·b[i] over n floats in 16 partial sums (the tail zero-padded), added pairwise. */
static inline float dot(const float *restrict a, const float *restrict b, long n) {
    floats16 sum = {0};
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        floats16 x, y;
        memcpy(&x, a + i, sizeof x);
        memcpy(&y, b + i, sizeof y);
        sum += x * y;
    }
    if (i < n) {
        floats16 x = {0}, y = {0};
        memcpy(&x, a + i, sizeof(float) * (size_t)(n - i));
        memcpy(&y, b + i, sizeof(float) * (size_t)(n - i));
        sum += x * y;
    }
    return lanes_sum(sum);
}

#define MOST_GROUP 16 /* query heads a key head serves (attend_rows refuses more) */

/* One query position's heads that read key head `keys`/`values` (`count` keys, kt floats apart; D
 * = dim): softmax(q·kᵀ·scale)·v for each of the `group` queries (qh floats apart), written `to_h`
 * floats apart from `to`. scores: group × count floats of scratch. The heads read each key and
 * value once together; each query's sums run over the keys in order, whatever the heads beside it
 * or the thread: a row's bits are its own. */
static void attend_group(const float *query, long qh, const float *keys, const float *values, long kt, long count,
                         long group, long dim, float scale, float *scores, float *to, long to_h) {
    for (long j = 0; j < count; j++)
        for (long h = 0; h < group; h++) scores[h * count + j] = dot(query + h * qh, keys + j * kt, dim) * scale;
    for (long h = 0; h < group; h++) {
        float *row = scores + h * count, top = -INFINITY;
        for (long j = 0; j < count; j++) top = row[j] > top ? row[j] : top;
        for (long j = 0; j < count; j++) row[j] -= top;
        exp_in_place(row, count);
        float total = pairwise_sum(row, count);
        for (long j = 0; j < count; j++) row[j] /= total;
    }
    for (long c = 0; c < dim; c += 16) {
        floats16 sum[MOST_GROUP] = {{0}};
        for (long j = 0; j < count; j++) {
            floats16 value;
            memcpy(&value, values + j * kt + c, sizeof value);
            for (long h = 0; h < group; h++) sum[h] += value * scores[h * count + j];
        }
        for (long h = 0; h < group; h++) memcpy(to + h * to_h + c, &sum[h], sizeof sum[h]);
    }
}

/* The most keys any query of `rows` sees. */
static long most_seen(const long *seen_from, const long *seen_to, long rows) {
    long most = 1;
    for (long r = 0; r < rows; r++)
        if (seen_to[r] - seen_from[r] > most) most = seen_to[r] - seen_from[r];
    return most;
}

/* softmax(q·kᵀ·scale)·v for each query of a pass over the keys it sees: q (B × H × L × D, strides
 * qb, qh, ql), k and v (B × KV × T × D, strides kb, kh, kt; D contiguous and a multiple of 16), KV
 * dividing H, at most MOST_GROUP query heads a key head (query head h reads key head h / (H / KV));
 * query (b, l) sees keys seen_from[b·L + l] up to seen_to[b·L + l]. out: B × H × L × D, contiguous.
 * One thread (a pass's blocks in one call split it: block_attention). */
int attend_rows(const float *q, long qb, long qh, long ql, const float *k, const float *v, long kb, long kh,
                long kt, long batch, long heads, long kv_heads, long length, long dim, const long *seen_from,
                const long *seen_to, float scale, float *out) {
    if (dim % 16 || kv_heads < 1 || heads % kv_heads || heads / kv_heads > MOST_GROUP) return -1;
    long group = heads / kv_heads;
    float *scores = malloc(sizeof(float) * (size_t)(group * most_seen(seen_from, seen_to, batch * length)));
    if (!scores) return -1;
    for (long b = 0; b < batch; b++)
        for (long l = 0; l < length; l++) {
            long from = seen_from[b * length + l], count = seen_to[b * length + l] - from;
            for (long g = 0; g < kv_heads; g++)
                attend_group(q + b * qb + g * group * qh + l * ql, qh, k + b * kb + g * kh + from * kt,
                             v + b * kb + g * kh + from * kt, kt, count, group, dim, scale, scores,
                             out + ((b * heads + g * group) * length + l) * dim, length * dim);
        }
    free(scores);
    return 1;
}

/* out = silu(gate)·up = gate / (1 + e^-gate) · up, row by row (gate and up: rows × n, `stride`
 * floats from a row to the next; out: rows × n, contiguous). */
int silu_times_rows(const float *gate, const float *up, long stride, long rows, long n, float *out) {
    for (long r = 0; r < rows; r++) {
        const float *g = gate + r * stride, *u = up + r * stride;
        float *to = out + r * n;
        for (long i = 0; i < n; i++) to[i] = -g[i];
        exp_in_place(to, n);
        for (long i = 0; i < n; i++) {
            float denominator = to[i] + 1.0f;
            float silu = g[i] / denominator;
            to[i] = silu * u[i];
        }
    }
    return 1;
}

/* [entropy bits, varentropy bits², p1 − p2] of each row of x (rows × n logits) into out (rows × 3), as
 * signals_numpy.py's numpy_token_signals defines them: d = x − max floored at −1000, e = e^d, s = Σe,
 * s1 = Σe·d, s2 = Σe·d², H = log s − s1/s, varentropy = s2/s − (s1/s)², p1 − p2 = (1 − e^(t2 − max))/s
 * with t2 the second largest (the largest where it is tied). One pass for the largest, one for the
 * sums and the second largest, 16 lanes summed a block at a time into doubles (NumPy's ~10 passes:
 * ~0.33 ms a 151,936-id row). e^d is 0 below −87 (fp32's e^d is at most a subnormal there). A row
 * with a NaN or an infinite largest logit gives NaN, as NumPy's does. */
#define SIGNAL_BLOCK 4096
int token_signals_rows(const float *x, long rows, long n, float *out) {
    const double ln2 = 0.69314718055994530942;
    for (long r = 0; r < rows; r++) {
        const float *row = x + r * n;
        float *to = out + 3 * r;
        const floats16 low = {0}, floor_d = low - 1000.0f, none = low - INFINITY;
        floats16 top16 = none;
        ints16 nan16 = {0};
        for (long i = 0; i < n; i += 16) {
            floats16 v = none;
            memcpy(&v, row + i, sizeof(float) * (size_t)(n - i < 16 ? n - i : 16));
            ints16 above = v > top16;
            nan16 |= v != v;
            top16 = (floats16)(((ints16)v & above) | ((ints16)top16 & ~above));
        }
        float top = -INFINITY;
        int nan = 0;
        for (int j = 0; j < 16; j++) {
            top = top16[j] > top ? top16[j] : top;
            nan |= nan16[j] != 0;
        }
        if (nan || isinf(top)) {
            to[0] = to[1] = to[2] = NAN;
            continue;
        }
        double s = 0, s1 = 0, s2 = 0;
        floats16 below16 = none;
        ints16 ties16 = {0};
        for (long start = 0; start < n; start += SIGNAL_BLOCK) {
            long end = start + SIGNAL_BLOCK < n ? start + SIGNAL_BLOCK : n;
            floats16 e_sum = low, ed_sum = low, edd_sum = low;
            for (long i = start; i < end; i += 16) {
                floats16 v = none;
                memcpy(&v, row + i, sizeof(float) * (size_t)(end - i < 16 ? end - i : 16));
                ints16 is_top = v == top, under = v < top;
                ties16 -= is_top; /* a lane's true is -1 */
                ints16 higher = under & (v > below16);
                below16 = (floats16)(((ints16)v & higher) | ((ints16)below16 & ~higher));
                floats16 d = v - top;
                ints16 floored = d < -1000.0f, zero = d < -87.0f;
                d = (floats16)(((ints16)floor_d & floored) | ((ints16)d & ~floored));
                floats16 e = (floats16)((ints16)exp16(d) & ~zero);
                floats16 ed = e * d;
                e_sum += e;
                ed_sum += ed;
                edd_sum += ed * d;
            }
            s += lanes_sum(e_sum);
            s1 += lanes_sum(ed_sum);
            s2 += lanes_sum(edd_sum);
        }
        long ties = 0;
        float below = -INFINITY;
        for (int j = 0; j < 16; j++) {
            ties += ties16[j];
            below = below16[j] > below ? below16[j] : below;
        }
        double second = ties > 1 ? top : below, mean = s1 / s;
        double entropy = log(s) - mean, spread = s2 / s - mean * mean;
        double margin = (1.0 - exp(second - (double)top > -1000.0 ? second - (double)top : -1000.0)) / s;
        to[0] = (float)(entropy / ln2);
        to[1] = (float)((spread > 0 ? spread : 0.0) / (ln2 * ln2));
        to[2] = (float)margin;
    }
    return 1;
}

/* ---- A decoder block's decoding pass in one call -------------------------------------------
 * For a llama/qwen2 block whose every product is the quantized kernel's on weights laid out as
 * its tiles (quant_rows.c's quant_tiled_rows, quant_tiled_q6k: given as function pointers, so
 * this library does not link that one): the same products, in the same order, with the same
 * operations between them as the NumPy block with these operations (cpu_blocks.numpy_block), so
 * the same bits; what it saves is Python's ~20 calls a block. */
typedef int (*tiled_fn)(const float *x, float *y, long rows, long n_in, int threads, long count, const void *w,
                        int wide);
typedef int (*q6k_fn)(const float *x, const void *tiles, float *y, long rows, long n_in, long n_out, int threads,
                      int wide);

/* quant_rows.c's quant_run_parts: fn(args, part, parts) on the products' threads, part 0 here. */
typedef long (*run_parts_fn)(void (*fn)(const void *, long, long), const void *args, long parts);

struct product {
    const void *weights; /* the tiled weights' fields (count of them), or Q6_K tiles */
    const float *bias;   /* n_out floats added to every row, or NULL */
    long count, n_in, n_out;
    int q6k, wide;
    /* A nested gear's active planes (1: a plain linear): the weights are each plane's in turn
     * (every linear's plane 0, then every linear's plane 1, ...), each plane's n_out outputs summed
     * in that order, as the NumPy block sums a gear's plane products (quant_weights_times). */
    long planes;
};

struct block_plan {
    struct product qkv, o, gate_up, down;
    const float *norm1, *norm2;
    float eps1, eps2, scale;
    long dims, inter, heads, kv_heads, head_dim, rope_dims;
    int traditional;
    const void *tiled, *q6k; /* tiled_fn, q6k_fn */
    const void *run_parts;   /* run_parts_fn, or NULL: attention on the calling thread alone */
};

static int product_rows(const struct block_plan *p, const struct product *w, const float *x, float *y, long rows,
                        int threads) {
    long n = w->n_out, all = w->planes * n;
    if (w->planes > 1 && w->q6k) return -1; /* planes are tiles: a Q6_K weight is one plane */
    float *planes_y = w->planes > 1 ? malloc(sizeof(float) * (size_t)(rows * all)) : y;
    if (!planes_y) return -1;
    int done = w->q6k ? ((q6k_fn)p->q6k)(x, w->weights, y, rows, w->n_in, n, threads, w->wide)
                      : ((tiled_fn)p->tiled)(x, planes_y, rows, w->n_in, threads, w->count, w->weights, w->wide);
    if (done >= 1 && w->planes > 1)
        for (long r = 0; r < rows; r++)
            for (long j = 0; j < n; j++) {
                float sum = planes_y[r * all + j];
                for (long k = 1; k < w->planes; k++) sum += planes_y[r * all + k * n + j];
                y[r * n + j] = sum;
            }
    if (w->planes > 1) free(planes_y);
    if (done < 1) return -1;
    if (w->bias)
        for (long r = 0; r < rows; r++)
            for (long j = 0; j < w->n_out; j++) y[r * w->n_out + j] += w->bias[j];
    return 1;
}

#define MOST_PARTS 64 /* quant_rows.c's MAX_PARTS */

/* A block's attention for every row of its pass, split by (row, key head) among the threads:
 * q: heads × rows × D (as rope_rows lays it out), out: rows × heads × D (the o projection's rows);
 * keys[s], values[s]: sequence s's cache (KV × caps[s] × D) with this pass's rows written. */
struct attention_job {
    const struct block_plan *p;
    const float *q;
    float *out;
    float *const *keys, *const *values;
    const long *caps, *lengths, *seen_from, *seen_to;
    long rows, most;
    int failed[MOST_PARTS];
};

static void attention_part(const void *args, long part, long parts) {
    struct attention_job *job = (struct attention_job *)args;
    const struct block_plan *p = job->p;
    long kv = p->kv_heads, d = p->head_dim, group = p->heads / kv, rows = job->rows, items = rows * kv;
    float *scores = malloc(sizeof(float) * (size_t)(group * job->most));
    if (!scores) {
        job->failed[part] = 1;
        return;
    }
    for (long item = items * part / parts, s = 0, first = 0; item < items * (part + 1) / parts; item++) {
        long r = item / kv, g = item % kv;
        while (r >= first + job->lengths[s]) first += job->lengths[s++];
        long from = job->seen_from[r], slot = (g * job->caps[s] + from) * d;
        attend_group(job->q + (g * group * rows + r) * d, rows * d, job->keys[s] + slot, job->values[s] + slot, d,
                     job->seen_to[r] - from, group, d, p->scale, scores, job->out + (r * p->heads + g * group) * d,
                     d);
    }
    free(scores);
}

static int block_attention(struct attention_job *job, int threads) {
    const struct block_plan *p = job->p;
    long kv = p->kv_heads, items = job->rows * kv, parts = threads < items ? threads : items;
    if (p->head_dim % 16 || kv < 1 || p->heads % kv || p->heads / kv > MOST_GROUP) return -1;
    memset(job->failed, 0, sizeof job->failed);
    if (parts > MOST_PARTS) parts = MOST_PARTS;
    if (parts > 1 && p->run_parts)
        parts = ((run_parts_fn)p->run_parts)(attention_part, job, parts);
    else
        attention_part(job, 0, parts = 1);
    for (long i = 0; i < parts; i++)
        if (job->failed[i]) return -1;
    return 1;
}

/* h (rows × dims) through the block, in place: the rows of `sequences` sequences one after another,
 * sequence s's lengths[s] rows at its positions starts[s].. (a packed pass: several conversations'
 * rows in one product). cos_t, sin_t: the rows' RoPE tables (rows × rope_dims/2); keys[s] and
 * values[s]: sequence s's cache of this layer (KV × caps[s] × D), its rows written at starts[s]..;
 * row r sees keys seen_from[r] up to seen_to[r] of its own sequence. Returns 1, or -1 (no memory,
 * a product refused: h is then as it was). */
static int block_rows(const struct block_plan *p, float *h, long rows, const float *cos_t, const float *sin_t,
                      float *const *keys, float *const *values, const long *caps, const long *starts,
                      const long *lengths, long sequences, const long *seen_from, const long *seen_to,
                      int threads) {
    long dims = p->dims, heads = p->heads, kv = p->kv_heads, d = p->head_dim, n_qkv = p->qkv.n_out;
    long sizes[] = {rows * dims, rows * n_qkv,        heads * rows * d, kv * rows * d, rows * heads * d,
                    rows * dims, rows * 2 * p->inter, rows * p->inter,  rows * dims};
    size_t total = 0;
    for (int i = 0; i < 9; i++) total += (size_t)sizes[i];
    float *scratch = malloc(sizeof(float) * total), *at[9];
    if (!scratch) return -1;
    at[0] = scratch;
    for (int i = 1; i < 9; i++) at[i] = at[i - 1] + sizes[i - 1];
    float *normed = at[0], *qkv = at[1], *q = at[2], *k = at[3], *att_rows = at[4];
    float *o = at[5], *gate_up = at[6], *hidden = at[7], *down = at[8];
    int ok = rms_norm_rows(h, p->norm1, p->eps1, normed, rows, dims) >= 1 &&
             product_rows(p, &p->qkv, normed, qkv, rows, threads) >= 1;
    if (ok) {
        rope_rows(qkv, 0, d, n_qkv, 1, heads, rows, d, p->rope_dims, p->traditional, cos_t, sin_t, 0, q);
        rope_rows(qkv + heads * d, 0, d, n_qkv, 1, kv, rows, d, p->rope_dims, p->traditional, cos_t, sin_t, 0, k);
        /* sequence s's keys and values into its cache, then every row's queries over them */
        for (long s = 0, first = 0; s < sequences; first += lengths[s], s++)
            for (long g = 0; g < kv; g++)
                for (long l = 0; l < lengths[s]; l++) {
                    long row = first + l, slot = (g * caps[s] + starts[s] + l) * d;
                    memcpy(keys[s] + slot, k + (g * rows + row) * d, sizeof(float) * (size_t)d);
                    memcpy(values[s] + slot, qkv + row * n_qkv + (heads + kv + g) * d, sizeof(float) * (size_t)d);
                }
        struct attention_job job = {p, q, att_rows, keys, values, caps, lengths, seen_from, seen_to, rows,
                                    most_seen(seen_from, seen_to, rows), {0}};
        ok = block_attention(&job, threads) >= 1 && product_rows(p, &p->o, att_rows, o, rows, threads) >= 1;
    }
    if (ok) {
        for (long i = 0; i < rows * dims; i++) o[i] = h[i] + o[i]; /* the residual, kept apart until the end */
        ok = rms_norm_rows(o, p->norm2, p->eps2, normed, rows, dims) >= 1 &&
             product_rows(p, &p->gate_up, normed, gate_up, rows, threads) >= 1;
    }
    if (ok) {
        silu_times_rows(gate_up, gate_up + p->inter, 2 * p->inter, rows, p->inter, hidden);
        ok = product_rows(p, &p->down, hidden, down, rows, threads) >= 1;
    }
    if (ok)
        for (long i = 0; i < rows * dims; i++) h[i] = o[i] + down[i];
    free(scratch);
    return ok ? 1 : -1;
}

/* Every block of a model body in turn (block_rows), h in place: layer i's plan plans[i], sequence
 * s's cache keys[i·sequences + s], values[…] of room caps[…]; the rows' RoPE tables, the sequences'
 * starts and lengths and the keys each row sees are the same in every layer. Returns 1, or -1
 * where a block refused (h is then the block's input before it). */
int blocks_rows(const struct block_plan *const *plans, long layers, float *h, long rows, const float *cos_t,
                const float *sin_t, float *const *keys, float *const *values, const long *caps, const long *starts,
                const long *lengths, long sequences, const long *seen_from, const long *seen_to, int threads) {
    for (long i = 0; i < layers; i++)
        if (block_rows(plans[i], h, rows, cos_t, sin_t, keys + i * sequences, values + i * sequences,
                       caps + i * sequences, starts, lengths, sequences, seen_from, seen_to, threads) < 1)
            return -1;
    return 1;
}
