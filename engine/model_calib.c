/* Model calibration (qcal/model_calib.h): the model's quantized tensors exposed in an
 * in-memory copy, the engine run after run, each run's outputs handed to an observer thread
 * of the calibration's own that feeds the calibration session.
 *
 * Why a thread per calibration and not OpenMP: the engine's Run blocks its caller for the
 * whole run. By default the caller waits for each run's outputs to be observed before the
 * next run (one run's outputs in memory) and observes them itself beside the thread, the
 * two taking tensors from a shared counter, while the engine's own threads sleep (its
 * session stops their spin-waiting when Run returns); an OpenMP team there would leave its
 * workers spinning into the next run. With `overlap` the thread observes alone while the
 * engine computes the next run: two runs' outputs at most. Each tensor's observer sees its
 * runs in order, whichever thread takes it, so the results do not depend on the split. */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "engine/engine_internal.h"
#include "io/half_dsp.h"
#include "qcal/model_calib.h"
#include "qcal/threads.h"

#define MSG_CAP 1024

/* An output of a run and its number of values: the order observers take them in. */
struct job_item {
    int64_t numel, index;
};

typedef struct carry_slot {
    char *out, *in;          /* "OUT=IN" split */
    int64_t out_idx;         /* index of OUT in the requested outputs */
    int64_t in_idx;          /* index of IN among the model inputs */
    void *buf;               /* the last run's OUT, or NULL (zeros / the file's) */
    size_t cap, bytes;
    int32_t ndim;
    int64_t dims[QCAL_MAX_DIMS];
} carry_slot;

struct qcal_model_calib {
    qcal_engine_session *sess;
    qcal_calib_session *s;
    qcal_model_calib_options opt;
    char **names;            /* observed tensors = the first n_names requested outputs */
    int64_t n_names;
    const char **req;        /* requested outputs: names, then carried outputs not among them */
    int64_t n_req;
    carry_slot *carry;
    int64_t n_carry;
    qcal_engine_io *inputs;
    int64_t n_inputs;
    int64_t step;            /* next run's index */
    qcal_model_calib_report rep;
    /* observer_auto: the runs go to eval (owned), not to s, until finish chooses. */
    qcal_numeric_eval *eval;
    bool scoring;            /* pass 2: eval is finished, the runs are scored */
    bool chosen;             /* finish wrote the choices into s */
    int64_t pass1_samples, pass1_files;
    int64_t progress_base;   /* samples of the passes before this one (observer_auto) */
    int64_t progress_passes; /* passes the progress total counts (1, or 2) */
    /* observer_auto at the outputs (auto_samples > 0, no carried state): the float model,
     * the QDQ options (strings owned) and the samples the candidates run on. */
    qcal_engine *e;
    void *model;
    size_t model_len;
    qcal_onnx_qdq_options qopt;
    char *qopt_op_types;
    char **qopt_exclude;
    engine_auto_run *kept;
    int64_t n_kept, kept_samples;

    /* The observer thread and its one-slot hand-over. */
    pthread_t th;
    bool th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool sync_ok;
    qcal_engine_outputs *job;   /* outputs waiting for / under observation */
    int64_t job_step;
    bool job_posted;            /* the job waits for the thread to take it */
    int job_parts;              /* observers of the job still working (the thread, the caller) */
    _Atomic int64_t job_next;   /* next position in job_order to take */
    struct job_item *job_order; /* the n_names outputs, largest first */
    int64_t job_fail_at;        /* the lowest index that failed in this job (n_names: none) */
    qcal_status job_fst;
    char job_err[MSG_CAP];
    char job_label[MSG_CAP];    /* "FILE, samples A-B" of the job's run (from feed_pass), or "" */
    char feed_label[MSG_CAP];   /* the same for the run about to be posted */
    bool werr_labeled;          /* werr starts with its run's label */
    int threads;                /* the calibration's threads (opt.threads or qcal's count) */
    bool busy, quit;
    qcal_status wst;            /* the first failure of the observers */
    char werr[MSG_CAP];
    int64_t empty;              /* empty tensors met (under mu) */
};

void qcal_model_calib_options_default(qcal_model_calib_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->profile = QCAL_ONNX_PROFILE_ORT;
    opt->max_run_bytes = (uint64_t)512 << 20;
    opt->ranks = 1;
    opt->auto_samples = 64;
}

/* ---- observing one run (the thread) ---- */

/* v's values as float32: in place for float32, else converted into *tmp (grown as needed). */
static qcal_status as_float(const qcal_engine_value *v, int64_t numel, float **tmp, size_t *cap,
                            const float **out)
{
    if (v->elem_type == QCAL_ONNX_FLOAT) {
        *out = v->data;
        return QCAL_OK;
    }
    size_t bytes;
    if (!qcal_mul_size((size_t)numel, sizeof(float), &bytes))
        return qcal_error(QCAL_ERR_OVERFLOW, "tensor '%s': too large", v->name);
    if (bytes > *cap) {
        float *n = realloc(*tmp, bytes);
        if (!n)
            return qcal_error(QCAL_ERR_NO_MEMORY, "tensor '%s': out of memory converting it "
                              "to float32", v->name);
        *tmp = n;
        *cap = bytes;
    }
    float *d = *tmp;
    if (v->elem_type == QCAL_ONNX_FLOAT16) {
        qcal_half_dsp_get()->f16_to_f32(v->data, (size_t)numel, d);   /* exact */
    } else if (v->elem_type == QCAL_ONNX_BFLOAT16) {
        qcal_half_dsp_get()->bf16_to_f32(v->data, (size_t)numel, d);  /* exact */
    } else if (v->elem_type == QCAL_ONNX_DOUBLE) {
        /* Rounded to nearest float32, as a float64 dump read by `qcal calibrate` is. */
        const double *s = v->data;
        for (int64_t i = 0; i < numel; i++)
            d[i] = (float)s[i];
    } else {
        return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s' is %s in the engine, not a float "
                          "tensor", v->name, qcal_engine_elem_name(v->elem_type));
    }
    *out = d;
    return QCAL_OK;
}

/* Output i of a run and its number of values. */
static qcal_status output_at(qcal_engine_outputs *o, int64_t i, qcal_engine_value *v,
                             int64_t *numel)
{
    qcal_status st = qcal_engine_outputs_at(o, i, v);
    if (st < 0)
        return st;
    *numel = 1;
    for (int32_t d = 0; d < v->ndim; d++)
        *numel *= v->dims[d];   /* the engine's own shapes: no overflow */
    return QCAL_OK;
}

/* Observes output i of run `step` and releases it. Sets *empty when it has no values. */
static qcal_status observe_one(qcal_model_calib *mc, qcal_engine_outputs *o, int64_t i,
                               int64_t step, float **tmp, size_t *cap, bool *empty)
{
    qcal_engine_value v;
    int64_t numel;
    qcal_status st = output_at(o, i, &v, &numel);
    if (st < 0)
        return st;
    if (numel == 0) {
        *empty = true;
        return QCAL_OK;
    }
    const float *f = NULL;
    if ((st = as_float(&v, numel, tmp, cap, &f)) < 0)
        return st;
    qcal_tensor x;
    if ((st = qcal_tensor_init(&x, f, v.ndim, v.dims)) < 0)
        return st;
    /* A failure's message names the tensor and the step (= the run's index). */
    if (!mc->eval) {
        st = qcal_calib_session_observe(mc->s, mc->names[i], QCAL_CALIB_ROLE_ACTIVATION, step,
                                        &x);
    } else {
        st = mc->scoring ? qcal_numeric_eval_score(mc->eval, mc->names[i],
                                                   QCAL_CALIB_ROLE_ACTIVATION, &x)
                         : qcal_numeric_eval_observe(mc->eval, mc->names[i],
                                                     QCAL_CALIB_ROLE_ACTIVATION, &x);
        if (st < 0)
            st = qcal_error(st, "activation '%s' run %lld (%s): %s", mc->names[i],
                            (long long)step, mc->scoring ? "scoring" : "observing",
                            qcal_last_error());
    }
    if (st < 0)
        return st;
    /* Observed: its memory goes back while the engine computes the next run. A carried
     * output was copied before the hand-over. */
    qcal_engine_outputs_release(o, i);
    return QCAL_OK;
}

/* One observer's share of the posted job: tensors taken from the shared counter, largest
 * first, each on this thread alone (qcal_threads_local_cap). Every tensor is tried even
 * after a failure, so the failure kept (the lowest index, with its message) does not depend
 * on the split. Then, the last one out frees the outputs and marks the observers idle. */
static void observe_share(qcal_model_calib *mc)
{
    qcal_engine_outputs *o = mc->job;
    int64_t step = mc->job_step;
    int64_t empty = 0, fail_at = mc->n_names;
    qcal_status fst = QCAL_OK;
    char msg[MSG_CAP] = "";
    int cap_before = qcal_threads_local_cap(1);
    float *tmp = NULL;
    size_t cap = 0;
    for (;;) {
        int64_t k = atomic_fetch_add(&mc->job_next, 1);
        if (k >= mc->n_names)
            break;
        int64_t i = mc->job_order[k].index;
        bool e = false;
        qcal_status st = observe_one(mc, o, i, step, &tmp, &cap, &e);
        empty += e;
        if (st < 0 && i < fail_at) {
            fail_at = i;
            fst = st;
            snprintf(msg, sizeof msg, "%s", qcal_last_error());
        }
    }
    free(tmp);
    qcal_threads_local_cap(cap_before);
    pthread_mutex_lock(&mc->mu);
    mc->empty += empty;
    if (fail_at < mc->job_fail_at) {
        mc->job_fail_at = fail_at;
        mc->job_fst = fst;
        memcpy(mc->job_err, msg, sizeof msg);
    }
    if (--mc->job_parts == 0) {
        if (mc->job_fst < 0 && mc->wst >= 0) {
            mc->wst = mc->job_fst;
            /* Labelled with its own run: with overlap it is met while a later run computes. */
            if (mc->job_label[0]) {
                /* a message longer than werr is cut short */
                if (snprintf(mc->werr, sizeof mc->werr, "%s: %s", mc->job_label,
                             mc->job_err) < 0)
                    memcpy(mc->werr, mc->job_err, sizeof mc->werr);
            } else {
                memcpy(mc->werr, mc->job_err, sizeof mc->werr);
            }
            mc->werr_labeled = mc->job_label[0] != 0;
        }
        qcal_engine_outputs_free(&mc->job);
        mc->busy = false;
        pthread_cond_broadcast(&mc->cv);
    }
    pthread_mutex_unlock(&mc->mu);
}

static void *observer_main(void *arg)
{
    qcal_model_calib *mc = arg;
    pthread_mutex_lock(&mc->mu);
    for (;;) {
        while (!mc->job_posted && !mc->quit)
            pthread_cond_wait(&mc->cv, &mc->mu);
        if (!mc->job_posted)
            break;
        mc->job_posted = false;
        pthread_mutex_unlock(&mc->mu);
        observe_share(mc);
        pthread_mutex_lock(&mc->mu);
    }
    pthread_mutex_unlock(&mc->mu);
    return NULL;
}

/* Waits until the thread is idle; returns its first failure (its message set again on the
 * calling thread). */
static qcal_status wait_idle(qcal_model_calib *mc)
{
    if (!mc->th_started)
        return QCAL_OK;
    pthread_mutex_lock(&mc->mu);
    while (mc->busy)
        pthread_cond_wait(&mc->cv, &mc->mu);
    qcal_status st = mc->wst;
    char msg[MSG_CAP];
    memcpy(msg, mc->werr, sizeof msg);
    pthread_mutex_unlock(&mc->mu);
    return st < 0 ? qcal_error(st, "%s", msg) : QCAL_OK;
}

static qcal_status start_thread(qcal_model_calib *mc)
{
    if (pthread_mutex_init(&mc->mu, NULL))
        return qcal_error(QCAL_ERR_NO_MEMORY, "cannot create a mutex");
    if (pthread_cond_init(&mc->cv, NULL)) {
        pthread_mutex_destroy(&mc->mu);
        return qcal_error(QCAL_ERR_NO_MEMORY, "cannot create a condition variable");
    }
    mc->sync_ok = true;
    /* The thread takes no signals: the process's handlers keep running on its own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&mc->th, NULL, observer_main, mc);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err)
        return qcal_error(QCAL_ERR_NO_MEMORY, "cannot start the observer thread: %s",
                          strerror(err));
    mc->th_started = true;
    return QCAL_OK;
}

/* ---- set-up ---- */

static qcal_status parse_carry(qcal_model_calib *mc, const qcal_model_calib_options *opt)
{
    if (opt->n_carry < 0 || (opt->n_carry && !opt->carry))
        return qcal_error(QCAL_ERR_INVALID_ARG, "model calibration: bad carry list");
    if (!opt->n_carry)
        return QCAL_OK;
    mc->carry = calloc((size_t)opt->n_carry, sizeof *mc->carry);
    if (!mc->carry)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    mc->n_carry = opt->n_carry;
    for (int64_t k = 0; k < opt->n_carry; k++) {
        const char *c = opt->carry[k], *eq = c ? strchr(c, '=') : NULL;
        if (!eq || eq == c || !eq[1])
            return qcal_error(QCAL_ERR_INVALID_ARG, "carry '%s': expected OUTPUT=INPUT",
                              c ? c : "(null)");
        carry_slot *cs = &mc->carry[k];
        cs->out = qcal_strdup(c);
        cs->in = qcal_strdup(eq + 1);
        if (!cs->out || !cs->in)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        cs->out[eq - c] = '\0';
        cs->in_idx = cs->out_idx = -1;
        cs->ndim = -1;   /* nothing carried yet */
    }
    return QCAL_OK;
}

/* Resolves the carried inputs and outputs against the session; builds the request list. */
static qcal_status resolve(qcal_model_calib *mc)
{
    int64_t n_in = qcal_engine_session_input_count(mc->sess);
    int64_t n_out = qcal_engine_session_output_count(mc->sess);
    mc->inputs = calloc((size_t)n_in + 1, sizeof *mc->inputs);
    mc->req = calloc((size_t)(mc->n_names + mc->n_carry) + 1, sizeof *mc->req);
    if (!mc->inputs || !mc->req)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    mc->n_inputs = n_in;
    qcal_status st;
    for (int64_t i = 0; i < n_in; i++)
        if ((st = qcal_engine_session_input(mc->sess, i, &mc->inputs[i])) < 0)
            return st;
    for (int64_t i = 0; i < mc->n_names; i++)
        mc->req[i] = mc->names[i];
    mc->n_req = mc->n_names;
    for (int64_t k = 0; k < mc->n_carry; k++) {
        carry_slot *cs = &mc->carry[k];
        for (int64_t i = 0; i < n_in; i++)
            if (!strcmp(mc->inputs[i].name, cs->in))
                cs->in_idx = i;
        if (cs->in_idx < 0)
            return qcal_error(QCAL_ERR_NOT_FOUND, "carry '%s=%s': the model has no input '%s'",
                              cs->out, cs->in, cs->in);
        for (int64_t k2 = 0; k2 < k; k2++)
            if (mc->carry[k2].in_idx == cs->in_idx)
                return qcal_error(QCAL_ERR_INVALID_ARG, "input '%s' is carried twice", cs->in);
        const qcal_engine_io *in = &mc->inputs[cs->in_idx];
        qcal_engine_io out;
        bool found = false;
        for (int64_t i = 0; i < n_out && !found; i++) {
            if ((st = qcal_engine_session_output(mc->sess, i, &out)) < 0)
                return st;
            found = !strcmp(out.name, cs->out);
        }
        if (!found)
            return qcal_error(QCAL_ERR_NOT_FOUND, "carry '%s=%s': the model has no output '%s'",
                              cs->out, cs->in, cs->out);
        if (out.elem_type != in->elem_type)
            return qcal_error(QCAL_ERR_MISMATCH, "carry '%s=%s': output '%s' is %s, input '%s' "
                              "takes %s", cs->out, cs->in, cs->out,
                              qcal_engine_elem_name(out.elem_type), cs->in,
                              qcal_engine_elem_name(in->elem_type));
        for (int64_t i = 0; i < mc->n_req; i++)
            if (!strcmp(mc->req[i], cs->out))
                cs->out_idx = i;
        if (cs->out_idx < 0) {
            cs->out_idx = mc->n_req;
            mc->req[mc->n_req++] = cs->out;
        }
    }
    return QCAL_OK;
}

/* A copy of the QDQ options the candidates at the outputs are made with (its strings too). */
static qcal_status keep_qdq_options(qcal_model_calib *mc, const qcal_onnx_qdq_options *q)
{
    mc->qopt = *q;
    mc->qopt.op_types = NULL;
    mc->qopt.exclude = NULL;
    if (q->op_types) {
        if (!(mc->qopt_op_types = qcal_strdup(q->op_types)))
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        mc->qopt.op_types = mc->qopt_op_types;
    }
    if (q->n_exclude > 0) {
        if (!(mc->qopt_exclude = calloc((size_t)q->n_exclude, sizeof *mc->qopt_exclude)))
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        for (int64_t i = 0; i < q->n_exclude; i++)
            if (!(mc->qopt_exclude[i] = qcal_strdup(q->exclude[i])))
                return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        mc->qopt.exclude = (const char *const *)mc->qopt_exclude;
    }
    return QCAL_OK;
}

/* The evaluation of observer_auto: the commuting candidates with the session's default
 * activation qconfig and bins, so an entry differs from the default observer's only in its
 * kind and range. */
static qcal_status auto_eval_create(qcal_numeric_eval **out)
{
    qcal_numeric_eval_options eo;
    qcal_numeric_eval_options_default(&eo);
    eo.kinds = QCAL_MODEL_CALIB_AUTO_KINDS;
    qcal_observer_config def;
    qcal_status st = qcal_calib_role_default_config(QCAL_CALIB_ROLE_ACTIVATION, &def);
    if (st < 0)
        return st;
    eo.activation_q = def.q;
    eo.bins = def.bins;
    return qcal_numeric_eval_create(&eo, out);
}

qcal_status qcal_model_calib_create(qcal_engine *e, const qcal_onnx_model *m, qcal_calib_session *s,
                                    const qcal_model_calib_options *opt, qcal_model_calib **out)
{
    if (!e || !m || !s || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "model calibration: NULL argument");
    qcal_model_calib_options def;
    if (!opt) {
        qcal_model_calib_options_default(&def);
        opt = &def;
    }
    if (opt->batch < 0 || opt->ranks < 1 || opt->rank < 0 || opt->rank >= opt->ranks ||
        opt->threads < 0 || !opt->max_run_bytes || opt->auto_samples < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "model calibration: impossible options (batch "
                          "%lld, rank %lld of %lld, threads %d, max_run_bytes %llu, "
                          "auto_samples %lld)",
                          (long long)opt->batch, (long long)opt->rank, (long long)opt->ranks,
                          opt->threads, (unsigned long long)opt->max_run_bytes,
                          (long long)opt->auto_samples);
    if (opt->observer_auto && opt->ranks > 1)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "observer choice (observer_auto) runs in one "
                          "process: its evaluation is not merged across %lld ranks",
                          (long long)opt->ranks);
    qcal_model_calib *mc = calloc(1, sizeof *mc);
    if (!mc)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    mc->s = s;
    mc->opt = *opt;
    mc->progress_passes = opt->observer_auto ? 2 : 1;
    mc->rep.auto_choice = -1;
    for (int k = 0; k <= QCAL_OBSERVER_KIND_COUNT; k++) {
        mc->rep.auto_sqnr_db[k] = NAN;
        mc->rep.auto_agree[k] = -1;
    }
    mc->opt.carry = NULL;
    mc->opt.exclude = NULL;
    mc->opt.op_types = NULL;
    qcal_onnx_model *copy = NULL;
    void *bytes = NULL;
    size_t len = 0;
    qcal_status st = parse_carry(mc, opt);
    if (st < 0)
        goto fail;

    /* The tensors, exposed in a copy of the model. */
    qcal_onnx_qdq_options q;
    qcal_onnx_qdq_options_default(&q);
    q.profile = opt->profile;
    q.op_types = opt->op_types;
    q.exclude = opt->exclude;
    q.n_exclude = opt->n_exclude;
    if ((st = qcal_onnx_list(m, &q, &mc->names, &mc->n_names)) < 0)
        goto fail;
    if (!mc->n_names) {
        st = qcal_error(QCAL_ERR_EMPTY, "the model has no tensor that profile %s quantizes: "
                        "nothing to calibrate", qcal_onnx_profile_name(opt->profile));
        goto fail;
    }
    if ((st = qcal_onnx_model_serialize(m, &bytes, &len)) < 0 ||
        (st = qcal_onnx_model_parse(bytes, len, &copy)) < 0)
        goto fail;
    if (opt->observer_auto && opt->auto_samples > 0 && !mc->n_carry) {
        /* the float model, kept for the candidates' QDQ models */
        mc->model = bytes;
        mc->model_len = len;
        mc->e = e;
        if ((st = keep_qdq_options(mc, opt->auto_qdq ? opt->auto_qdq : &q)) < 0)
            goto fail;
    } else {
        qcal_free(bytes);
    }
    bytes = NULL;
    if ((st = qcal_onnx_expose(copy, &q, NULL)) < 0 ||
        (st = qcal_onnx_model_serialize(copy, &bytes, &len)) < 0)
        goto fail;
    qcal_onnx_model_destroy(&copy);

    qcal_engine_session_options so;
    qcal_engine_session_options_default(&so);
    so.optimization = 0;   /* every tensor computed as the model says (ORT's calibrator too) */
    /* ONNX Runtime's arena: the runs repeat the same requests, so it serves every run from
     * the memory of the first. Without it each run goes to malloc, whose heap layout (and so
     * the peak RSS) then depends on address-space randomization: the same serial calibration
     * of the demo CNN peaked at 61 to 96 MiB from one process to the next, 64-65 MiB with the
     * arena (docs/performance.md, "Calibrating by running the model"). */
    so.cpu_arena = true;
    /* Between runs the cores are the observers': the engine's threads sleep when Run
     * returns instead of spin-waiting beside them. */
    so.stop_spinning = true;
    so.threads = opt->threads;
    mc->threads = opt->threads > 0 ? opt->threads : qcal_threads_count();
    st = qcal_engine_session_create(e, bytes, len, &so, &mc->sess);
    qcal_free(bytes);
    bytes = NULL;
    if (st < 0)
        goto fail;
    if ((st = resolve(mc)) < 0 || (st = start_thread(mc)) < 0)
        goto fail;
    if (opt->observer_auto && (st = auto_eval_create(&mc->eval)) < 0)
        goto fail;
    *out = mc;
    return QCAL_OK;
fail:
    qcal_free(bytes);
    qcal_onnx_model_destroy(&copy);
    {
        char msg[MSG_CAP];
        snprintf(msg, sizeof msg, "%s", qcal_last_error());
        qcal_model_calib_destroy(&mc);
        qcal_error(st, "%s", msg);
    }
    return st;
}

int64_t qcal_model_calib_input_count(const qcal_model_calib *mc)
{
    return mc ? mc->n_inputs : 0;
}

qcal_status qcal_model_calib_input(const qcal_model_calib *mc, int64_t i, qcal_engine_io *out)
{
    if (!mc || !out || i < 0 || i >= mc->n_inputs)
        return qcal_error(QCAL_ERR_INVALID_ARG, "model calibration: no input %lld", (long long)i);
    *out = mc->inputs[i];
    return QCAL_OK;
}

int64_t qcal_model_calib_tensor_count(const qcal_model_calib *mc)
{
    return mc ? mc->n_names : 0;
}

const char *qcal_model_calib_tensor(const qcal_model_calib *mc, int64_t i)
{
    return mc && i >= 0 && i < mc->n_names ? mc->names[i] : NULL;
}

/* ---- runs ---- */

qcal_status qcal_model_calib_reset(qcal_model_calib *mc)
{
    if (!mc)
        return qcal_error(QCAL_ERR_INVALID_ARG, "model calibration: NULL argument");
    for (int64_t k = 0; k < mc->n_carry; k++) {
        mc->carry[k].bytes = 0;
        mc->carry[k].ndim = -1;
    }
    return QCAL_OK;
}

/* Zeros of the carried input's declared shape (dynamic dimensions: an error). */
static qcal_status carry_zeros(qcal_model_calib *mc, carry_slot *cs, qcal_engine_value *v)
{
    const qcal_engine_io *in = &mc->inputs[cs->in_idx];
    size_t es = qcal_engine_elem_size(in->elem_type), bytes = es;
    if (!es || in->ndim < 0)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "carried input '%s': type or rank unknown; "
                          "give its first value in the data", cs->in);
    for (int32_t d = 0; d < in->ndim; d++) {
        if (in->dims[d] < 0)
            return qcal_error(QCAL_ERR_UNSUPPORTED, "carried input '%s' has a dynamic "
                              "dimension: give its first value in the data", cs->in);
        if (!qcal_mul_size(bytes, (size_t)in->dims[d], &bytes))
            return qcal_error(QCAL_ERR_OVERFLOW, "carried input '%s': too large", cs->in);
    }
    if (bytes > cs->cap || !cs->buf) {
        void *n = realloc(cs->buf, bytes ? bytes : 1);
        if (!n)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        cs->buf = n;
        cs->cap = bytes;
    }
    memset(cs->buf, 0, bytes);
    cs->bytes = bytes;
    cs->ndim = in->ndim;
    memcpy(cs->dims, in->dims, sizeof cs->dims);
    v->data = cs->buf;
    v->nbytes = bytes;
    v->ndim = cs->ndim;
    memcpy(v->dims, cs->dims, sizeof v->dims);
    return QCAL_OK;
}

static qcal_status keep_carry(carry_slot *cs, const qcal_engine_value *v)
{
    if (v->nbytes > cs->cap || !cs->buf) {
        void *n = realloc(cs->buf, v->nbytes ? v->nbytes : 1);
        if (!n)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory keeping output '%s'", cs->out);
        cs->buf = n;
        cs->cap = v->nbytes;
    }
    if (v->nbytes)
        memcpy(cs->buf, v->data, v->nbytes);
    cs->bytes = v->nbytes;
    cs->ndim = v->ndim;
    memcpy(cs->dims, v->dims, sizeof cs->dims);
    return QCAL_OK;
}

static int job_item_cmp(const void *a, const void *b)
{
    const struct job_item *x = a, *y = b;
    if (x->numel != y->numel)
        return x->numel > y->numel ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* The order the observers take a run's outputs in: largest first, so that the two sharing
 * a run end close together (the order changes no result); *bytes: the outputs' bytes. */
static qcal_status order_job(qcal_model_calib *mc, qcal_engine_outputs *o, uint64_t *bytes)
{
    if (!mc->job_order && mc->n_names) {
        mc->job_order = calloc((size_t)mc->n_names, sizeof *mc->job_order);
        if (!mc->job_order)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    for (int64_t i = 0; i < mc->n_names; i++) {
        qcal_engine_value v;
        int64_t numel;
        qcal_status st = output_at(o, i, &v, &numel);
        if (st < 0)
            return st;
        mc->job_order[i] = (struct job_item){numel, i};
        *bytes += v.nbytes;
    }
    if (mc->n_names > 1)
        qsort(mc->job_order, (size_t)mc->n_names, sizeof *mc->job_order, job_item_cmp);
    return QCAL_OK;
}

static qcal_status run_once(qcal_model_calib *mc, const qcal_engine_value *inputs, int64_t n_inputs,
                            uint64_t *out_bytes)
{
    qcal_status st = QCAL_OK;
    if (n_inputs < 0 || (n_inputs && !inputs))
        return qcal_error(QCAL_ERR_INVALID_ARG, "model calibration: bad input list");
    qcal_engine_value *v = calloc((size_t)mc->n_inputs + 1, sizeof *v);
    if (!v)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    /* In model order: the caller's value by name; a carried input from the last run. */
    for (int64_t i = 0; i < mc->n_inputs && st >= 0; i++) {
        const qcal_engine_io *in = &mc->inputs[i];
        const qcal_engine_value *given = NULL;
        for (int64_t j = 0; j < n_inputs; j++)
            if (inputs[j].name && !strcmp(inputs[j].name, in->name))
                given = &inputs[j];
        carry_slot *cs = NULL;
        for (int64_t k = 0; k < mc->n_carry; k++)
            if (mc->carry[k].in_idx == i)
                cs = &mc->carry[k];
        v[i].name = in->name;
        v[i].elem_type = in->elem_type;
        if (cs && cs->ndim >= 0) {
            v[i].data = cs->buf;
            v[i].nbytes = cs->bytes;
            v[i].ndim = cs->ndim;
            memcpy(v[i].dims, cs->dims, sizeof v[i].dims);
        } else if (given && given->data) {
            v[i] = *given;
        } else if (cs) {
            st = carry_zeros(mc, cs, &v[i]);
        } else {
            st = qcal_error(QCAL_ERR_MISMATCH, "no value for input '%s'", in->name);
        }
    }
    for (int64_t j = 0; j < n_inputs && st >= 0; j++) {
        bool known = false;
        for (int64_t i = 0; i < mc->n_inputs && !known; i++)
            known = inputs[j].name && !strcmp(inputs[j].name, mc->inputs[i].name);
        if (!known)
            st = qcal_error(QCAL_ERR_MISMATCH, "'%s' is not an input of the model",
                            inputs[j].name ? inputs[j].name : "(null)");
    }
    qcal_engine_outputs *o = NULL;
    if (st >= 0) {
        double t0 = engine_now_s();
        st = qcal_engine_session_run(mc->sess, v, mc->n_inputs, mc->req, mc->n_req, &o);
        mc->rep.engine_seconds += engine_now_s() - t0;
    }
    free(v);
    if (st < 0)
        return st;
    /* The carried outputs copied out before the outputs go to the observers. */
    for (int64_t k = 0; k < mc->n_carry && st >= 0; k++) {
        qcal_engine_value cv;
        if ((st = qcal_engine_outputs_at(o, mc->carry[k].out_idx, &cv)) >= 0)
            st = keep_carry(&mc->carry[k], &cv);
    }
    double t0 = engine_now_s();
    if (st >= 0)
        st = wait_idle(mc);   /* an observer's failure before this run is posted */
    mc->rep.wait_seconds += engine_now_s() - t0;
    /* job_order serves the previous run until its observers are done (with overlap). */
    uint64_t bytes = 0;
    if (st >= 0)
        st = order_job(mc, o, &bytes);
    if (st < 0) {
        qcal_engine_outputs_free(&o);
        return st;
    }
    if (out_bytes)
        *out_bytes = bytes;
    if (bytes > mc->rep.max_run_bytes)
        mc->rep.max_run_bytes = bytes;
    /* Not overlapped (the default): this thread observes beside the observer thread, and
     * the next run starts once these outputs are observed and released, so the engine
     * reuses their memory and the peak is one run's. The evaluation of observer_auto takes
     * one tensor at a time, and one thread is one core: the thread observes alone there. */
    bool share = !mc->opt.overlap && !mc->eval && mc->threads >= 2;
    pthread_mutex_lock(&mc->mu);
    mc->job = o;
    mc->job_step = mc->step++;
    mc->job_posted = true;
    mc->job_parts = share ? 2 : 1;
    atomic_store(&mc->job_next, 0);
    mc->job_fail_at = mc->n_names;
    mc->job_fst = QCAL_OK;
    mc->job_err[0] = 0;
    memcpy(mc->job_label, mc->feed_label, sizeof mc->job_label);
    mc->busy = true;
    pthread_cond_broadcast(&mc->cv);
    pthread_mutex_unlock(&mc->mu);
    mc->rep.runs++;
    if (!mc->opt.overlap) {
        t0 = engine_now_s();
        if (share)
            observe_share(mc);
        st = wait_idle(mc);
        mc->rep.wait_seconds += engine_now_s() - t0;
        if (st < 0)
            return st;
    }
    return QCAL_OK;
}

static qcal_status keep_run(qcal_model_calib *mc, const qcal_engine_value *v, int64_t n);

/* A given input the model takes with a dynamic first (batch) dimension. */
static bool batched(const qcal_model_calib *mc, const qcal_engine_value *v)
{
    for (int64_t i = 0; i < mc->n_inputs; i++)
        if (v->name && !strcmp(v->name, mc->inputs[i].name))
            return mc->inputs[i].ndim > 0 && mc->inputs[i].dims[0] < 0 && v->data && v->ndim > 0;
    return false;
}

qcal_status qcal_model_calib_feed(qcal_model_calib *mc, const qcal_engine_value *inputs,
                                  int64_t n_inputs)
{
    if (!mc)
        return qcal_error(QCAL_ERR_INVALID_ARG, "model calibration: NULL argument");
    qcal_status st = run_once(mc, inputs, n_inputs, NULL);
    if (st >= 0) {
        /* Samples: the first dimension of a given input the model takes with a dynamic
         * batch dimension (a scalar or fixed-shape input, as Silero VAD's sr, counts none);
         * 1 when there is none. */
        int64_t n = 1;
        bool keep = mc->model && !mc->scoring && mc->kept_samples < mc->opt.auto_samples;
        for (int64_t j = 0; j < n_inputs; j++)
            if (batched(mc, &inputs[j])) {
                n = inputs[j].dims[0];
                break;
            }
        mc->rep.samples += n;
        /* observer_auto at the outputs: the first samples of the first pass, one per run
         * (each input the model takes with a dynamic first dimension sliced on it), as
         * qcal_model_calib_feed_dataset keeps them: the figures do not depend on the runs */
        for (int64_t k = 0; keep && k < n && st >= 0 && mc->kept_samples < mc->opt.auto_samples;
             k++) {
            qcal_engine_value *sv = malloc((size_t)(n_inputs ? n_inputs : 1) * sizeof *sv);
            if (!sv)
                return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            for (int64_t j = 0; j < n_inputs; j++) {
                sv[j] = inputs[j];
                if (n > 1 && batched(mc, &inputs[j]) && inputs[j].dims[0] == n) {
                    size_t per = inputs[j].nbytes / (size_t)n;
                    sv[j].data = (const char *)inputs[j].data + per * (size_t)k;
                    sv[j].nbytes = per;
                    sv[j].dims[0] = 1;
                }
            }
            st = keep_run(mc, sv, n_inputs);
            free(sv);
            mc->kept_samples++;
        }
    }
    return st;
}

static qcal_status keep_run(qcal_model_calib *mc, const qcal_engine_value *v, int64_t n)
{
    engine_auto_run *k = realloc(mc->kept, (size_t)(mc->n_kept + 1) * sizeof *k);
    if (!k)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    mc->kept = k;
    qcal_status st = engine_auto_keep(v, n, &mc->kept[mc->n_kept]);
    if (st >= 0)
        mc->n_kept++;
    return st;
}

/* observer_auto at the outputs: the first auto_samples samples of this process's share of
 * ds, one per run, in data order (any batch of the passes: the same samples). */
static qcal_status keep_samples(qcal_model_calib *mc, qcal_dataset *ds)
{
    const qcal_model_calib_options *o = &mc->opt;
    int64_t files = qcal_dataset_file_count(ds);
    qcal_status st = QCAL_OK;
    for (int64_t f = o->rank; f < files && st >= 0 && mc->kept_samples < o->auto_samples;
         f += o->ranks) {
        qcal_dataset_file_info fi;
        if ((st = qcal_dataset_file_get(ds, f, &fi)) < 0)
            break;
        for (int64_t s0 = 0; s0 < fi.samples && st >= 0 && mc->kept_samples < o->auto_samples;) {
            /* a file that cannot be split is one sample */
            int64_t n = fi.splittable ? 1 : fi.samples;
            qcal_dataset_batch *b = NULL;
            if ((st = qcal_dataset_read(ds, f, s0, n, &b)) < 0)
                break;
            st = keep_run(mc, qcal_dataset_batch_values(b), mc->n_inputs);
            qcal_dataset_batch_free(&b);
            mc->kept_samples++;
            s0 += n;
        }
    }
    return st;
}

static int64_t share_samples(qcal_dataset *ds, const qcal_model_calib_options *o)
{
    int64_t n = 0, files = qcal_dataset_file_count(ds);
    for (int64_t f = o->rank; f < files; f += o->ranks) {
        qcal_dataset_file_info fi;
        if (qcal_dataset_file_get(ds, f, &fi) == QCAL_OK)
            n += fi.samples;
    }
    return n;
}

/* One pass over this process's share of ds. */
static qcal_status feed_pass(qcal_model_calib *mc, qcal_dataset *ds)
{
    const qcal_model_calib_options *o = &mc->opt;
    int64_t files = qcal_dataset_file_count(ds), total = share_samples(ds, o), done = 0;
    int64_t batch = o->batch;
    qcal_status st = QCAL_OK;
    for (int64_t f = o->rank; f < files && st >= 0; f += o->ranks) {
        qcal_dataset_file_info fi;
        if ((st = qcal_dataset_file_get(ds, f, &fi)) < 0 || (st = qcal_model_calib_reset(mc)) < 0)
            break;
        mc->rep.files++;
        for (int64_t s0 = 0; s0 < fi.samples && st >= 0;) {
            /* Automatic batch: the first run takes one sample, and its output bytes set the
             * size of every later run. */
            int64_t n = 1;
            if (fi.splittable)
                n = batch > 0 ? batch : 1;
            if (n > fi.samples - s0)
                n = fi.samples - s0;
            qcal_dataset_batch *b = NULL;
            if ((st = qcal_dataset_read(ds, f, s0, n, &b)) < 0)
                break;
            uint64_t bytes = 0;
            snprintf(mc->feed_label, sizeof mc->feed_label, "%s, samples %lld-%lld", fi.path,
                     (long long)s0, (long long)(s0 + n - 1));
            st = run_once(mc, qcal_dataset_batch_values(b), mc->n_inputs, &bytes);
            qcal_dataset_batch_free(&b);
            if (st < 0) {
                /* An observer's failure names its own run (werr_labeled); any other is this
                 * run's. */
                if (!mc->werr_labeled)
                    st = qcal_error(st, "%s: %s", mc->feed_label, qcal_last_error());
                break;
            }
            if (fi.splittable && batch <= 0) {
                uint64_t per = bytes / (uint64_t)n;
                batch = per ? (int64_t)(o->max_run_bytes / per) : INT64_MAX / 2;
                if (batch < 1)
                    batch = 1;
                mc->rep.batch = batch;
            } else if (fi.splittable && !mc->rep.batch) {
                mc->rep.batch = batch;
            }
            s0 += n;
            done += n;
            mc->rep.samples += n;
            if (o->progress)
                o->progress(o->progress_user, mc->progress_base + done,
                            total * mc->progress_passes, fi.path);
        }
    }
    mc->feed_label[0] = 0;
    return st;
}

qcal_status qcal_model_calib_next_pass(qcal_model_calib *mc)
{
    if (!mc)
        return qcal_error(QCAL_ERR_INVALID_ARG, "model calibration: NULL argument");
    if (!mc->eval || mc->scoring)
        return qcal_error(QCAL_ERR_STATE, mc->eval ? "observer_auto: already in the second pass"
                                                   : "a second pass needs observer_auto");
    /* The observer thread reads `scoring` only while it has a job: wait for it. */
    qcal_status st = wait_idle(mc);
    if (st < 0 || (st = qcal_numeric_eval_finish(mc->eval)) < 0)
        return st;
    mc->scoring = true;
    mc->pass1_samples = mc->rep.samples;
    mc->pass1_files = mc->rep.files;
    mc->progress_base = mc->rep.samples;
    return QCAL_OK;
}

/* observer_auto, after pass 2: each tensor's observer into the session: the one its SQNR
 * recommends (kind < 0) or kind. */
static qcal_status choose(qcal_model_calib *mc, int32_t kind)
{
    int64_t n = 0;
    qcal_status st = qcal_numeric_eval_count(mc->eval, &n);
    for (int64_t i = 0; i < n && st >= 0; i++) {
        qcal_numeric_eval_tensor t;
        const qcal_observer *obs = NULL;
        if ((st = qcal_numeric_eval_result(mc->eval, i, &t)) < 0)
            break;
        qcal_observer_kind k = kind < 0 ? t.candidates[t.recommended].kind : (qcal_observer_kind)kind;
        if ((st = qcal_numeric_eval_observer(mc->eval, i, k, &obs)) < 0)
            break;
        /* The session counts every element of the batches applied, non-finite included. */
        st = qcal_calib_session_merge_observer(mc->s, t.name, t.role, obs, t.count + t.nonfinite);
        mc->rep.chosen[k]++;
    }
    return st;
}

qcal_status qcal_model_calib_feed_dataset(qcal_model_calib *mc, qcal_dataset *ds)
{
    if (!mc || !ds)
        return qcal_error(QCAL_ERR_INVALID_ARG, "model calibration: NULL argument");
    if (!mc->eval || mc->scoring)
        return feed_pass(mc, ds);
    qcal_status st = QCAL_OK;
    if (mc->model && !mc->n_kept)
        st = keep_samples(mc, ds);
    if (st >= 0)
        st = feed_pass(mc, ds);
    if (st >= 0 && (st = qcal_model_calib_next_pass(mc)) >= 0)
        st = feed_pass(mc, ds);
    return st;
}

qcal_status qcal_model_calib_finish(qcal_model_calib *mc, qcal_model_calib_report *rep)
{
    if (!mc)
        return qcal_error(QCAL_ERR_INVALID_ARG, "model calibration: NULL argument");
    double t0 = engine_now_s();
    qcal_status st = wait_idle(mc);
    mc->rep.wait_seconds += engine_now_s() - t0;
    if (st < 0)
        return st;
    if (mc->eval && !mc->chosen) {
        if (!mc->scoring)
            return qcal_error(QCAL_ERR_STATE, "observer_auto: finish before the second pass "
                              "(qcal_model_calib_next_pass, then the same runs again)");
        int32_t kind = -1;
        if (mc->model && mc->n_kept) {
            double t1 = engine_now_s();
            st = engine_auto_choose(mc->e, mc->model, mc->model_len, &mc->qopt, mc->opt.threads,
                                    mc->eval, mc->kept, mc->n_kept, &kind, mc->rep.auto_sqnr_db,
                                    mc->rep.auto_agree);
            mc->rep.engine_seconds += engine_now_s() - t1;
            if (st < 0)
                return st;
            mc->rep.auto_samples = mc->kept_samples;
        }
        mc->rep.auto_choice = kind;
        if ((st = choose(mc, kind)) < 0)
            return st;
        mc->chosen = true;
        mc->rep.samples = mc->pass1_samples;   /* the data's, not the passes' */
        mc->rep.files = mc->pass1_files;
    }
    if ((st = qcal_calib_session_flush(mc->s)) < 0)
        return st;
    mc->rep.tensors = mc->n_names;
    mc->rep.passes = mc->eval ? 2 : 1;
    pthread_mutex_lock(&mc->mu);
    mc->rep.empty = mc->empty;
    pthread_mutex_unlock(&mc->mu);
    if (rep)
        *rep = mc->rep;
    return QCAL_OK;
}

void qcal_model_calib_destroy(qcal_model_calib **pmc)
{
    if (!pmc || !*pmc)
        return;
    qcal_model_calib *mc = *pmc;
    if (mc->th_started) {
        pthread_mutex_lock(&mc->mu);
        mc->quit = true;
        pthread_cond_broadcast(&mc->cv);
        pthread_mutex_unlock(&mc->mu);
        pthread_join(mc->th, NULL);
    }
    if (mc->sync_ok) {
        pthread_cond_destroy(&mc->cv);
        pthread_mutex_destroy(&mc->mu);
    }
    qcal_engine_outputs_free(&mc->job);
    free(mc->job_order);
    qcal_numeric_eval_destroy(&mc->eval);
    for (int64_t i = 0; i < mc->n_kept; i++)
        engine_auto_run_free(&mc->kept[i]);
    free(mc->kept);
    qcal_free(mc->model);
    free(mc->qopt_op_types);
    for (int64_t i = 0; mc->qopt_exclude && i < mc->qopt.n_exclude; i++)
        free(mc->qopt_exclude[i]);
    free(mc->qopt_exclude);
    qcal_engine_session_destroy(&mc->sess);
    qcal_onnx_names_free(&mc->names, mc->n_names);
    for (int64_t k = 0; k < mc->n_carry; k++) {
        free(mc->carry[k].out);
        free(mc->carry[k].in);
        free(mc->carry[k].buf);
    }
    free(mc->carry);
    free(mc->req);
    free(mc->inputs);
    free(mc);
    *pmc = NULL;
}

qcal_status qcal_model_calib_run(qcal_engine *e, const qcal_onnx_model *m, const char *data,
                                 const char *const *entries, int64_t n_entries,
                                 qcal_calib_session *s, const qcal_model_calib_options *opt,
                                 qcal_model_calib_report *rep)
{
    qcal_model_calib *mc = NULL;
    qcal_dataset *ds = NULL;
    qcal_status st = qcal_model_calib_create(e, m, s, opt, &mc);
    if (st < 0)
        return st;
    const char **optional = calloc((size_t)mc->n_carry + 1, sizeof *optional);
    if (!optional) {
        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    for (int64_t k = 0; k < mc->n_carry; k++)
        optional[k] = mc->carry[k].in;
    qcal_dataset_options dopt;
    qcal_dataset_options_default(&dopt);
    dopt.optional = optional;
    dopt.n_optional = mc->n_carry;
    if ((st = qcal_dataset_open(data, entries, n_entries, mc->inputs, mc->n_inputs, &dopt,
                                &ds)) < 0)
        goto out;
    if ((st = qcal_model_calib_feed_dataset(mc, ds)) < 0)
        goto out;
    st = qcal_model_calib_finish(mc, rep);
out:
    free(optional);
    qcal_dataset_close(&ds);
    if (st < 0) {
        char msg[MSG_CAP];
        snprintf(msg, sizeof msg, "%s", qcal_last_error());
        qcal_model_calib_destroy(&mc);
        return qcal_error(st, "%s", msg);
    }
    qcal_model_calib_destroy(&mc);
    return st;
}
