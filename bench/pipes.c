/* What this CPU's cores can do for the int8 products: `bench_layers.py pipes` compiles and runs it.
 *
 * Printed, per core and for every core at once (a thread a core): AVX-512 VNNI byte products a
 * second (vpdpbusd on 512 bits, 8 independent accumulators), the same with a broadcast load beside
 * each (the tiles' kernels load each row's 4 activation bytes so), with 4 fp32 fused multiply-adds
 * beside every 8 (the kernels scale each block's sums so) and with 4 vector ands beside every 8;
 * then int16 pair products (vpdpwssd: the down projections' rows). A product's floor on this CPU
 * follows from the first; what the others add says which of a kernel's instructions compete with
 * its products. Inline assembly, so that what runs is exactly these instructions (a compiler's
 * register copies would be timed too). x86-64 with AVX-512 VNNI only; elsewhere it says so and
 * exits 2. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) && defined(__AVX512VNNI__)
#define LOOPS 20000000L
static int activations[64];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define PRODUCTS8                                                                                  \
    "vpdpbusd %%zmm0, %%zmm1, %%zmm2\n vpdpbusd %%zmm0, %%zmm1, %%zmm3\n"                          \
    "vpdpbusd %%zmm0, %%zmm1, %%zmm4\n vpdpbusd %%zmm0, %%zmm1, %%zmm5\n"                          \
    "vpdpbusd %%zmm0, %%zmm1, %%zmm6\n vpdpbusd %%zmm0, %%zmm1, %%zmm7\n"                          \
    "vpdpbusd %%zmm0, %%zmm1, %%zmm8\n vpdpbusd %%zmm0, %%zmm1, %%zmm9\n"
#define BROADCAST8                                                                                 \
    "vpbroadcastd (%0), %%zmm20\n vpdpbusd %%zmm20, %%zmm1, %%zmm2\n"                              \
    "vpbroadcastd 4(%0), %%zmm21\n vpdpbusd %%zmm21, %%zmm1, %%zmm3\n"                             \
    "vpbroadcastd 8(%0), %%zmm22\n vpdpbusd %%zmm22, %%zmm1, %%zmm4\n"                             \
    "vpbroadcastd 12(%0), %%zmm23\n vpdpbusd %%zmm23, %%zmm1, %%zmm5\n"                            \
    "vpbroadcastd 16(%0), %%zmm24\n vpdpbusd %%zmm24, %%zmm1, %%zmm6\n"                            \
    "vpbroadcastd 20(%0), %%zmm25\n vpdpbusd %%zmm25, %%zmm1, %%zmm7\n"                            \
    "vpbroadcastd 24(%0), %%zmm26\n vpdpbusd %%zmm26, %%zmm1, %%zmm8\n"                            \
    "vpbroadcastd 28(%0), %%zmm27\n vpdpbusd %%zmm27, %%zmm1, %%zmm9\n"
#define PAIRS8                                                                                     \
    "vpdpwssd %%zmm0, %%zmm1, %%zmm2\n vpdpwssd %%zmm0, %%zmm1, %%zmm3\n"                          \
    "vpdpwssd %%zmm0, %%zmm1, %%zmm4\n vpdpwssd %%zmm0, %%zmm1, %%zmm5\n"                          \
    "vpdpwssd %%zmm0, %%zmm1, %%zmm6\n vpdpwssd %%zmm0, %%zmm1, %%zmm7\n"                          \
    "vpdpwssd %%zmm0, %%zmm1, %%zmm8\n vpdpwssd %%zmm0, %%zmm1, %%zmm9\n"
#define FMA4                                                                                       \
    "vfmadd231ps %%zmm10, %%zmm11, %%zmm12\n vfmadd231ps %%zmm10, %%zmm11, %%zmm13\n"              \
    "vfmadd231ps %%zmm10, %%zmm11, %%zmm14\n vfmadd231ps %%zmm10, %%zmm11, %%zmm15\n"
#define AND4                                                                                       \
    "vpandd %%zmm10, %%zmm11, %%zmm12\n vpandd %%zmm10, %%zmm11, %%zmm13\n"                        \
    "vpandd %%zmm10, %%zmm11, %%zmm14\n vpandd %%zmm10, %%zmm11, %%zmm15\n"
#define CLOBBERS                                                                                   \
    "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm12", "xmm13", "xmm14",     \
        "xmm15", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27"
#define TIMED(BODY)                                                                                \
    {                                                                                              \
        double started = now();                                                                    \
        for (long i = 0; i < LOOPS; i++) __asm__ volatile(BODY ::"r"(activations) : CLOBBERS);     \
        return LOOPS / (now() - started);                                                          \
    }

/* Loops of each body a second (each loop 8 products, and what the name says beside them). */
static double products(void) TIMED(PRODUCTS8)
static double with_broadcasts(void) TIMED(BROADCAST8)
static double with_fma(void) TIMED(PRODUCTS8 FMA4)
static double with_and(void) TIMED(PRODUCTS8 AND4)
static double pairs(void) TIMED(PAIRS8)

struct run {
    double products, broadcasts, fma, and, pairs; /* loops a second */
};

static void *measure(void *out) {
    struct run *r = out;
    r->products = products();
    r->broadcasts = with_broadcasts();
    r->fma = with_fma();
    r->and = with_and();
    r->pairs = pairs();
    return NULL;
}

static void print(const char *who, const struct run *r) {
    printf("%-10s vpdpbusd zmm %.2f G/s (%.0f G int8 multiply-adds a second); ns a loop of 8 of them: %.2f, "
           "+8 broadcast loads %.2f, +4 fp32 FMAs %.2f, +4 ands %.2f; vpdpwssd zmm (int16) %.0f G a second\n",
           who, 8 * r->products / 1e9, 8 * 64 * r->products / 1e9, 1e9 / r->products, 1e9 / r->broadcasts,
           1e9 / r->fma, 1e9 / r->and, 8 * 32 * r->pairs / 1e9);
}

int main(int argc, char **argv) {
    int cores = argc > 1 ? atoi(argv[1]) : 2;
    if (cores < 1 || cores > 64) cores = 2;
    struct run one;
    measure(&one);
    print("one core", &one);
    pthread_t threads[64];
    struct run runs[64];
    for (int c = 0; c < cores; c++) pthread_create(&threads[c], NULL, measure, &runs[c]);
    double total = 0;
    for (int c = 0; c < cores; c++) {
        pthread_join(threads[c], NULL);
        char who[32];
        snprintf(who, sizeof who, "core %d/%d", c + 1, cores);
        print(who, &runs[c]);
        total += 8 * 64 * runs[c].products;
    }
    printf("all %d at once: %.0f G int8 multiply-adds a second\n", cores, total / 1e9);
    return 0;
}
#else
int main(void) {
    puts("this CPU or compiler has no AVX-512 VNNI (x86-64, -march=native): nothing measured");
    return 2;
}
#endif
