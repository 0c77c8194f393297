/* Host cost of a launch through a generated export-c function against a bare cuLaunchKernel of the
 * same kernel, both from C. Built by bench_export_c_launch.py against the example's export (prefix ex,
 * kernel `empty`); argv[1] is the same kernel's cubin for the bare path's own module.
 * Batches of 500 launches (below the driver's queue depth, so the GPU never throttles the host),
 * timed without the synchronisation after each; the two sides alternate; medians of 41 batches.
 * Prints one JSON object. */
#define _POSIX_C_SOURCE 200809L
#include "ex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH 500
#define ROUNDS 41

typedef opsmith_CUresult (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      void *, void **, void **);
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
#define PROC(var, name)                                                                  \
    do {                                                                                 \
        void *p_ = NULL;                                                                 \
        if (opsmith_ex_get_proc(name, &p_)) { fprintf(stderr, "%s\n", opsmith_ex_last_error()); return 2; } \
        memcpy(&var, &p_, sizeof var);                                                   \
    } while (0)

int main(int argc, char **argv) {
    opsmith_CUresult (*retain)(void **, int), (*set_current)(void *), (*load_data)(void **, const void *),
        (*get_function)(void **, void *, const char *), (*sync)(void);
    launch_fn launch;
    void *ctx, *module, *fn;
    FILE *f;
    long size;
    char *cubin;
    double ours[ROUNDS], bare[ROUNDS];
    int round, i, arg = 0, bad = 0;
    void *args[1];
    opsmith_dim3 one = opsmith_dim3_make(1, 1, 1);
    if (argc < 2) { fprintf(stderr, "usage: %s empty.cubin [device]\n", argv[0]); return 2; }
    if (opsmith_ex_load(argc > 2 ? atoi(argv[2]) : 0)) { fprintf(stderr, "%s\n", opsmith_ex_last_error()); return 2; }
    PROC(retain, "cuDevicePrimaryCtxRetain"); PROC(set_current, "cuCtxSetCurrent");
    PROC(load_data, "cuModuleLoadData"); PROC(get_function, "cuModuleGetFunction");
    PROC(sync, "cuCtxSynchronize"); PROC(launch, "cuLaunchKernel");
    retain(&ctx, argc > 2 ? atoi(argv[2]) : 0);
    set_current(ctx);
    f = fopen(argv[1], "rb");
    if (f == NULL) { perror(argv[1]); return 2; }
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    fseek(f, 0, SEEK_SET);
    cubin = (char *)malloc((size_t)size);
    if (fread(cubin, 1, (size_t)size, f) != (size_t)size) return 2;
    fclose(f);
    if (load_data(&module, cubin) || get_function(&fn, module, "empty")) { fprintf(stderr, "bare load failed\n"); return 2; }
    args[0] = &arg;
    for (i = 0; i < 2000; ++i) { /* warm-up of both paths */
        bad |= opsmith_ex_empty_launch(NULL, one, one, 0, 0);
        bad |= launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
    }
    sync();
    for (round = 0; round < ROUNDS; ++round) {
        double t = now();
        for (i = 0; i < BATCH; ++i) bad |= opsmith_ex_empty_launch(NULL, one, one, 0, i);
        ours[round] = (now() - t) / BATCH * 1e6;
        sync();
        t = now();
        for (i = 0; i < BATCH; ++i) {
            arg = i;
            bad |= launch(fn, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
        }
        bare[round] = (now() - t) / BATCH * 1e6;
        sync();
    }
    if (bad) { fprintf(stderr, "a launch failed: %s\n", opsmith_ex_last_error()); return 1; }
    qsort(ours, ROUNDS, sizeof(double), cmp);
    qsort(bare, ROUNDS, sizeof(double), cmp);
    printf("{\"ours_us\": %.4f, \"bare_us\": %.4f, \"extra_us\": %.4f, \"ratio\": %.3f, \"batch\": %d, \"rounds\": %d}\n",
           ours[ROUNDS / 2], bare[ROUNDS / 2], ours[ROUNDS / 2] - bare[ROUNDS / 2], ours[ROUNDS / 2] / bare[ROUNDS / 2],
           BATCH, ROUNDS);
    return 0;
}
