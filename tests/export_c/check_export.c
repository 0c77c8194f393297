/* Drives an exported library (prefix t: relu, scale_f = scale<float>, big_shared) against the
 * fake driver (fake_libcuda.c) and prints what happened as key=value lines for the test. */
#include "t.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static void *fake;
#define FAKE(ret, name, args) ret(*name) args
static FAKE(void, set_args, (int, const int *));
static FAKE(const char *, last_symbol, (void));
static FAKE(void, last_launch, (unsigned *, unsigned *, unsigned *, void **));
static FAKE(const unsigned char *, last_arg, (int));
static FAKE(void, counts, (int *, int *, int *, int *));
static FAKE(void *, other_ctx, (int));
static FAKE(void *, current, (void));
static FAKE(int, set_current, (void *));

#define BIND(var, sym) do { void *p_ = dlsym(fake, sym); memcpy(&var, &p_, sizeof var); } while (0)

static void *worker(void *arg) {
    float x = 0.f;
    (void)arg;
    return (void *)(long)opsmith_t_relu_launch(NULL, opsmith_dim3_make(1, 1, 1), opsmith_dim3_make(32, 1, 1), 0,
                                                &x, &x, 1);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "basic";
    int r, loaded, unloaded, ptx, released, i;
    if (strcmp(mode, "nodriver") == 0) {
        r = opsmith_t_load(0);
        printf("load=%d\nmessage=%s\nerror_string=%s\n", r, opsmith_t_last_error(), opsmith_t_error_string(r));
        return 0;
    }
    fake = dlopen("libcuda.so.1", RTLD_NOW);
    if (fake == NULL || dlsym(fake, "fake_set_args") == NULL) { printf("error=not the fake driver\n"); return 2; }
    BIND(set_args, "fake_set_args"); BIND(last_symbol, "fake_last_symbol"); BIND(last_launch, "fake_last_launch");
    BIND(last_arg, "fake_last_arg"); BIND(counts, "fake_counts"); BIND(other_ctx, "fake_other_ctx");
    BIND(current, "fake_current"); BIND(set_current, "cuCtxSetCurrent");
    if (strcmp(mode, "arch") == 0) {
        for (i = 0; i < 2; ++i) {
            r = opsmith_t_load(i);
            printf("load%d=%d\narch%d=%s\n", i, r, i, r ? opsmith_t_last_error() : opsmith_t_loaded_arch(i));
        }
        return 0;
    }
    if (strcmp(mode, "threads") == 0) {
        pthread_t th[8];
        void *ret;
        int bad = 0;
        for (i = 0; i < 8; ++i) pthread_create(&th[i], NULL, worker, NULL);
        for (i = 0; i < 8; ++i) { pthread_join(th[i], &ret); bad += ret != NULL; }
        counts(&loaded, &unloaded, &ptx, &released);
        printf("failed=%d\nmodules_loaded=%d\n", bad, loaded);
        return 0;
    }
    {   /* basic: launch with no current context -> device 0, typed arguments, streams, errors */
        float x[4], y[4];
        long long n = 1234567890123LL;
        int sizes[3] = {8, 8, 8}, sizes2[3] = {8, 4, 4}, sizes3[2] = {8, 4};
        unsigned grid[3], block[3], shared;
        void *stream, *p;
        float a = 2.5f;
        opsmith_kernel_attributes at;
        set_args(3, sizes);
        r = opsmith_t_relu_launch((opsmith_CUstream)(void *)0x1234, opsmith_dim3_make(7, 2, 1),
                                  opsmith_dim3_make(128, 1, 1), 0, x, y, n);
        last_launch(grid, block, &shared, &stream);
        printf("relu=%d\nsymbol=%s\ngrid=%u,%u,%u\nblock=%u,%u,%u\nshared=%u\nstream=%p\n", r, last_symbol(),
               grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream);
        memcpy(&p, last_arg(0), 8);
        printf("arg0_ok=%d\n", p == (void *)x);
        memcpy(&p, last_arg(1), 8);
        printf("arg1_ok=%d\n", p == (void *)y);
        printf("arg2_ok=%d\n", memcmp(last_arg(2), &n, 8) == 0);
        printf("current_is_device0=%d\narch0=%s\n", current() != NULL, opsmith_t_loaded_arch(0));
        set_args(3, sizes2);
        r = opsmith_t_scale_f_launch(NULL, opsmith_dim3_make(1, 1, 1), opsmith_dim3_make(1, 1, 1), 0, x, a, 3);
        printf("scale=%d\nscale_symbol=%s\narg1_float_ok=%d\n", r, last_symbol(), memcmp(last_arg(1), &a, 4) == 0);
        set_args(2, sizes3);
        r = opsmith_t_big_shared_launch(NULL, opsmith_dim3_make(1, 1, 1), opsmith_dim3_make(64, 1, 1), 200000, x, 5);
        printf("big_shared=%d\n", r);
        r = opsmith_t_big_shared_attributes(0, &at);
        printf("attributes=%d\nnum_regs=%d\nmax_dynamic_shared=%d\n", r, at.num_regs, at.max_dynamic_shared_size_bytes);
        r = opsmith_t_relu_launch(NULL, opsmith_dim3_make(0, 1, 1), opsmith_dim3_make(1, 1, 1), 0, x, y, n);
        printf("bad_launch=%d\nbad_message=%s\n", r, opsmith_t_last_error());
        r = opsmith_t_relu_attributes(0, NULL);
        printf("null_out=%d\n", r);
        r = opsmith_t_load(5);
        printf("bad_device=%d\nbad_device_message=%s\n", r, opsmith_t_last_error());
        set_current(other_ctx(0));
        r = opsmith_t_relu_launch(NULL, opsmith_dim3_make(1, 1, 1), opsmith_dim3_make(1, 1, 1), 0, x, y, n);
        printf("other_ctx=%d\nother_ctx_message=%s\n", r, opsmith_t_last_error());
        set_current(NULL);
        p = NULL;
        r = opsmith_t_get_proc("cuLaunchKernel", &p);
        printf("get_proc=%d\nget_proc_found=%d\n", r, p != NULL);
        r = opsmith_t_get_proc("cuNoSuchThing", &p);
        printf("get_proc_missing=%d\n", r);
        r = opsmith_t_unload();
        counts(&loaded, &unloaded, &ptx, &released);
        printf("unload=%d\nmodules_loaded=%d\nmodules_unloaded=%d\nreleased=%d\narch0_after=%s\n", r, loaded,
               unloaded, released, opsmith_t_loaded_arch(0) ? "loaded" : "none");
        r = opsmith_t_load(0);
        counts(&loaded, &unloaded, &ptx, &released);
        printf("reload=%d\nmodules_loaded_again=%d\n", r, loaded);
    }
    return 0;
}
