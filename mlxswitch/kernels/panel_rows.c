/* x · Wᵀ on a resident fp32 weight kept in panels: each weight is read from memory once for up to
 * GROUP rows, and once per panel (while it is still in cache) for more.
 *
 * Layout (kernels/panel_cpu.py builds it): W (out × in) as panels of PANEL output columns, panel p
 * holding W[p·PANEL + j, i] at p·in·PANEL + i·width + j (width: PANEL, or what is left for the
 * last panel), so a panel is one contiguous stream and the copy holds exactly out × in floats.
 * Why our own: OpenBLAS packs the whole weight for every sgemm call, so 2-8 rows cost 3-5x one
 * row on a 2-core x86 (bench/results/panel-rows-qwen.txt); a k-row pass here costs about one.
 * Plain C with GCC/Clang vector extensions: compiled on first use for this machine
 * (-march=native) and checked against NumPy before any model uses it. Threads: OpenMP, whose
 * workers spin between the ~200 products of a step (a Python thread pool, woken per product, took
 * a one-row layer set 1.19x BLAS's time where OpenMP took 0.81x); built without it, one thread.
 */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define PANEL 64
#define GROUP 6
#define LANES 16
#define VECS (PANEL / LANES)

typedef float vec __attribute__((vector_size(LANES * sizeof(float))));

static inline vec load(const float *p) { vec v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, vec v) { memcpy(p, &v, sizeof v); }

/* K rows (a compile-time count, so the K·VECS accumulators stay in registers) times one panel. */
#define ROWS_TIMES_PANEL(K)                                                                    \
    static void rows_##K(const float *x, const float *panel, float *y, long n_in, long n_out) { \
        vec acc[K][VECS];                                                                      \
        for (int r = 0; r < K; r++)                                                            \
            for (int v = 0; v < VECS; v++) acc[r][v] = (vec){0};                               \
        const float *w = panel;                                                                \
        for (long i = 0; i < n_in; i++, w += PANEL) {                                          \
            vec col[VECS];                                                                     \
            for (int v = 0; v < VECS; v++) col[v] = load(w + v * LANES);                       \
            for (int r = 0; r < K; r++) {                                                      \
                float xi = x[r * n_in + i];                                                    \
                for (int v = 0; v < VECS; v++) acc[r][v] += xi * col[v];                       \
            }                                                                                  \
        }                                                                                      \
        for (int r = 0; r < K; r++)                                                            \
            for (int v = 0; v < VECS; v++) store(y + r * n_out + v * LANES, acc[r][v]);        \
    }

ROWS_TIMES_PANEL(1)
ROWS_TIMES_PANEL(2)
ROWS_TIMES_PANEL(3)
ROWS_TIMES_PANEL(4)
ROWS_TIMES_PANEL(5)
ROWS_TIMES_PANEL(6)

typedef void (*rows_fn)(const float *, const float *, float *, long, long);
static const rows_fn ROWS[GROUP + 1] = {0, rows_1, rows_2, rows_3, rows_4, rows_5, rows_6};

/* A last panel narrower than PANEL (out not a multiple of it: small test models), plainly. */
static void rows_narrow(const float *x, const float *panel, float *y, long rows, long n_in,
                        long n_out, long width) {
    for (long r = 0; r < rows; r++)
        for (long j = 0; j < width; j++) {
            float sum = 0.f;
            for (long i = 0; i < n_in; i++) sum += x[r * n_in + i] * panel[i * width + j];
            y[r * n_out + j] = sum;
        }
}

/* y = x · Wᵀ: x is rows × n_in, y rows × n_out, both contiguous; the panels split between up to
 * `threads` threads. Returns the threads used. */
int panel_rows(const float *x, const float *panels, float *y, long rows, long n_in, long n_out,
               int threads) {
    long count = (n_out + PANEL - 1) / PANEL;
    if (threads > count) threads = (int)count;
    if (threads < 1) threads = 1;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#else
    threads = 1;
#endif
    for (long p = 0; p < count; p++) {
        const float *panel = panels + p * n_in * PANEL;
        long width = n_out - p * PANEL < PANEL ? n_out - p * PANEL : PANEL;
        if (width < PANEL) {
            rows_narrow(x, panel, y + p * PANEL, rows, n_in, n_out, width);
            continue;
        }
        for (long r = 0; r < rows; r += GROUP) {
            long k = rows - r < GROUP ? rows - r : GROUP;
            ROWS[k](x + r * n_in, panel, y + r * n_out + p * PANEL, n_in, n_out);
        }
    }
    return threads;
}

/* Whether this build runs products on more than one thread. */
int panel_threaded(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* The layout's constants, so the loader can check it builds the panels this file reads. */
long panel_width(void) { return PANEL; }
