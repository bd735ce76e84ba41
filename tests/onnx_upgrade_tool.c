/* Test helper (not installed): loads MODEL, raises it to OPSET (default 13) with
 * qcal_onnx_upgrade and saves OUT; prints the report (one line per adapted op type) on stdout, the error on stderr
 * (exit 3). tests/ort/test_upgrade.py runs both models in ONNX Runtime. */
#include <stdio.h>
#include <stdlib.h>

#include <qcal/onnx.h>

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: onnx_upgrade_tool MODEL.onnx OUT.onnx [OPSET]\n");
        return 2;
    }
    long long opset = argc == 4 ? atoll(argv[3]) : 13;
    qcal_onnx_model *m = NULL;
    qcal_onnx_upgrade_report rep = { 0 };
    qcal_status st = qcal_onnx_model_load_file(argv[1], &m);
    if (st == QCAL_OK && (st = qcal_onnx_upgrade(m, opset, &rep)) == QCAL_OK) {
        printf("opset %lld -> %lld\n", (long long)rep.from, (long long)rep.to);
        for (int64_t i = 0; i < rep.n_adapted; i++)
            printf("%s\n", rep.adapted[i]);
        st = qcal_onnx_model_save_file(m, NULL, argv[2]);
    }
    if (st != QCAL_OK)
        fprintf(stderr, "onnx_upgrade_tool: %s\n", qcal_last_error());
    qcal_onnx_upgrade_report_free(&rep);
    qcal_onnx_model_destroy(&m);
    return st == QCAL_OK ? 0 : 3;
}
