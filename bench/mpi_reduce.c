/* bench/mpi_reduce: run under mpirun -np N (bench/mpi_scale does). Measures
 *  - state bytes per observer kind (qcal_observer_save of default configs after 1M and
 *    after 4M values: merge cost must not grow with the data);
 *  - the session reduction of qcal/mpi.h: every rank holds a session of T tensors (default
 *    1000, default activation observer: histogram, 2048 bins) fed one batch each; the time
 *    of qcal_mpi_session_reduce onto rank 0 (slowest rank, median of R runs after a barrier)
 *    and the bytes of one rank's session state.
 * Prints one JSON object per line on rank 0.
 *
 *   mpirun -np N bench/mpi_reduce [--tensors T] [--repeat R] [--kinds] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include <qcal/mpi.h>
#include <qcal/qcal.h>

static void fill(float *d, int64_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)((s >> 40) & 0xffffff) / 16777216.0f;
        float v = (float)((s >> 16) & 0xffffff) / 16777216.0f;
        d[i] = (u + v - 1.0f) * 3.0f;   /* triangular, [-3, 3] */
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what)
{
    fprintf(stderr, "mpi_reduce: %s: %s\n", what, qcal_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* State bytes of kind k's default observer after `batches` updates of 1M values. */
static size_t state_bytes(int k, const float *d, int batches)
{
    qcal_observer_config c;
    qcal_observer_config_default(&c, (qcal_observer_kind)k);
    qcal_observer *o = NULL;
    if (qcal_observer_create(&c, &o) != QCAL_OK)
        die("create");
    /* Per-channel kinds: 1024 rows of 1024 (channels on axis 0). */
    int64_t shape[2] = { 1024, 1024 };
    for (int b = 0; b < batches; b++) {
        qcal_tensor t;
        qcal_tensor_init(&t, d + (size_t)b * 1024 * 1024, 2, shape);
        if (qcal_observer_update(o, &t) != QCAL_OK)
            die("update");
    }
    void *buf = NULL;
    size_t len = 0;
    if (qcal_observer_save(o, &buf, &len) != QCAL_OK)
        die("save");
    qcal_free(buf);
    qcal_observer_destroy(&o);
    return len;
}

static void kinds(void)
{
    const int64_t n = 4 << 20;
    float *d = malloc((size_t)n * sizeof *d);
    if (!d)
        die("out of memory");
    fill(d, n, 3);
    for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++) {
        int pc = k == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
                 k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
        printf("{\"kind\": \"%s\", \"channels\": %d, \"state_bytes_1m\": %zu, "
               "\"state_bytes_4m\": %zu}\n", qcal_observer_kind_name((qcal_observer_kind)k),
               pc ? 1024 : 1, state_bytes(k, d, 1), state_bytes(k, d, 4));
    }
    free(d);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, tensors = 1000, repeat = 5;
    bool do_kinds = false;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tensors") && i + 1 < argc)
            tensors = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kinds"))
            do_kinds = true;
    }
    if (do_kinds && rank == 0)
        kinds();

    /* Every rank: a session of `tensors` activations, one 4096-value batch each. */
    enum { BATCH = 4096 };
    float d[BATCH];
    double *times = calloc((size_t)repeat, sizeof *times);
    size_t state_bytes = 0;
    for (int r = 0; r < repeat; r++) {
        qcal_calib_session *s = NULL;
        if (qcal_calib_session_create(NULL, &s) != QCAL_OK)
            die("session");
        for (int t = 0; t < tensors; t++) {
            char name[64];
            snprintf(name, sizeof name, "layers.%d.act", t);
            fill(d, BATCH, (uint64_t)t * 1000 + (uint64_t)rank);
            int64_t shape[1] = { BATCH };
            qcal_tensor x;
            qcal_tensor_init(&x, d, 1, shape);
            if (qcal_calib_session_observe(s, name, QCAL_CALIB_ROLE_ACTIVATION, 0, &x) != QCAL_OK)
                die("observe");
        }
        if (r == 0) {
            void *buf = NULL;
            if (qcal_calib_session_save(s, &buf, &state_bytes) != QCAL_OK)
                die("save");
            qcal_free(buf);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (qcal_mpi_session_reduce(s, 0, MPI_COMM_WORLD) != QCAL_OK)
            die("reduce");
        double mine = MPI_Wtime() - t0, slowest = 0;
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        times[r] = slowest;
        qcal_calib_session_destroy(&s);
    }
    qsort(times, (size_t)repeat, sizeof *times, cmp_d);
    int depth = 0;
    while ((1 << depth) < size)
        depth++;
    if (rank == 0)
        printf("{\"ranks\": %d, \"tensors\": %d, \"tree_depth\": %d, "
               "\"state_bytes_per_rank\": %zu, "
               "\"bytes_moved\": %zu, \"reduce_ms_median\": %.3f, \"reduce_ms_min\": %.3f, "
               "\"reduce_ms_max\": %.3f}\n",
               size, tensors, depth, state_bytes, state_bytes * (size_t)(size - 1),
               times[repeat / 2] * 1e3, times[0] * 1e3, times[repeat - 1] * 1e3);
    free(times);
    MPI_Finalize();
    return 0;
}
