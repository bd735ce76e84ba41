// unit.cxx_api: the public API from C++ as an embedder holds its data: read-only inputs
// come from a const std::vector<float> (qcal_tensor.data is const float *), outputs go
// through writable views (qcal_tensor_mut). Compiling this file is half of the test: with a
// float *data member, v.data() of a const vector does not convert and the build fails.
#include <qcal/qcal.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

static int failures = 0;

#define CHECK(cond)                                                                       \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            std::fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__,    \
                         #cond, qcal_last_error());                                       \
            failures++;                                                                   \
        }                                                                                 \
    } while (0)

int main()
{
    const std::vector<float> v = { -1.0f, 0.0f, 1.0f, 2.0f };
    const int64_t shape[1] = { (int64_t)v.size() };
    qcal_tensor x;
    CHECK(qcal_tensor_init(&x, v.data(), 1, shape) == QCAL_OK);

    // observe -> qparams -> quantize, all on the const input
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    qcal_observer *obs = nullptr;
    CHECK(qcal_observer_create(&cfg, &obs) == QCAL_OK);
    CHECK(qcal_observer_update(obs, &x) == QCAL_OK);
    qcal_qparams qp = {};
    CHECK(qcal_observer_qparams(obs, &qp) == QCAL_OK);
    CHECK(qp.zero_point == 85);
    CHECK(qp.scale == 3.0f / 255.0f);
    std::vector<uint8_t> codes(v.size());
    CHECK(qcal_quantize(&x, &qp, codes.data()) == QCAL_OK);
    const uint8_t want[4] = { 0, 85, 170, 255 };
    for (size_t i = 0; i < codes.size(); i++)
        CHECK(codes[i] == want[i]);

    // dequantize into a writable view
    std::vector<float> back(v.size());
    qcal_tensor_mut out;
    CHECK(qcal_tensor_mut_init(&out, back.data(), 1, shape) == QCAL_OK);
    CHECK(qcal_dequantize(codes.data(), &qp, &out) == QCAL_OK);
    for (size_t i = 0; i < back.size(); i++)
        CHECK(std::fabs(back[i] - v[i]) <= 1e-6f);

    // fake-quant: const source, writable destination; the read-only view of a writable one
    std::vector<float> y(v.size());
    qcal_tensor_mut yv;
    CHECK(qcal_tensor_mut_init(&yv, y.data(), 1, shape) == QCAL_OK);
    std::vector<uint8_t> mask(v.size());
    CHECK(qcal_fakequant_forward(&x, &qp, &yv, mask.data()) == QCAL_OK);
    qcal_tensor yr;
    CHECK(qcal_tensor_mut_view(&yv, &yr) == QCAL_OK);
    CHECK(yr.data == y.data() && yr.ndim == 1 && yr.shape[0] == 4);
    int64_t n = 0;
    CHECK(qcal_tensor_mut_numel(&yv, &n) == QCAL_OK && n == 4);
    for (size_t i = 0; i < y.size(); i++) {
        CHECK(y[i] == back[i]);
        CHECK(mask[i] == 1);
    }

    // the FakeQuantize object takes views the same way (const source, writable destination)
    qcal_fakequant_module_config mc;
    qcal_fakequant_module_config_default(&mc, QCAL_FAKEQUANT_PRESET_WEIGHT_PER_TENSOR);
    qcal_fakequant_module *fq = nullptr;
    CHECK(qcal_fakequant_module_create(&mc, &fq) == QCAL_OK);
    std::vector<float> wq(v.size()), gx(v.size());
    qcal_tensor_mut wqv, gxv;
    CHECK(qcal_tensor_mut_init(&wqv, wq.data(), 1, shape) == QCAL_OK);
    CHECK(qcal_tensor_mut_init(&gxv, gx.data(), 1, shape) == QCAL_OK);
    CHECK(qcal_fakequant_module_forward(fq, &x, &wqv) == QCAL_OK);
    const std::vector<float> gy = { 0.5f, -0.25f, 1.0f, 2.0f };
    qcal_tensor gyv;
    CHECK(qcal_tensor_init(&gyv, gy.data(), 1, shape) == QCAL_OK);
    CHECK(qcal_fakequant_module_backward(fq, &gyv, &gxv) == QCAL_OK);
    for (size_t i = 0; i < gx.size(); i++)
        CHECK(gx[i] == gy[i]);   // every value inside the observed range: mask 1
    qcal_fakequant_module_destroy(&fq);

    qcal_qparams_free(&qp);
    qcal_observer_destroy(&obs);
    CHECK(obs == nullptr);
    if (failures == 0)
        std::printf("ok: the C API from C++ with const std::vector<float> inputs\n");
    return failures == 0 ? 0 : 1;
}
