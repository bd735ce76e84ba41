/* Internal to onnx/'s reader: what load.c (the wire format, the mapping, the unpack) and
 * check.c (the checks, external data) share while a model is read. */
#ifndef QCAL_ONNX_LOAD_H
#define QCAL_ONNX_LOAD_H

#include <sys/types.h>

#include "onnx/onnx_internal.h"

/* Nesting deeper than this (messages on the wire, subgraphs) is refused, so the recursive
 * unpack and checks cannot exhaust the stack. */
#define ONNX_MAX_DEPTH 64

/* One read in progress. */
typedef struct load_ctx {
    const char *path;      /* model file or NULL (buffer) */
    int fd;                /* the model file, or -1 */
    const uint8_t *map;    /* its mapping (NULL: a buffer; cut-out bytes are copied) */
    size_t map_len;
    bool map_taken;        /* the model kept the mapping (the loader must not unmap it) */
    qcal_onnx_model *m;    /* the model being checked (external data files are mapped into it) */
    char *dir_real;        /* realpath of the model's directory */
    char *dir;             /* the model's directory as given */
} load_ctx;

/* Adds a mapped file to m (which then owns fd and the mapping); false: out of memory. */
bool onnx_model_add_src(qcal_onnx_model *m, int fd, const uint8_t *map, size_t len, dev_t dev, ino_t ino);

/* Checks the unpacked main graph g of lc->m and its subgraphs (names defined before they are
 * read, single assignment, initializer sizes) and brings external data in (mapped for
 * main-graph initializers). The message is set on failure (without the file name). */
qcal_status onnx_check_model(load_ctx *lc, Onnx__GraphProto *g);

#endif
