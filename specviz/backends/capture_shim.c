/*
 * specviz layer-capture shim: a llama.cpp eval callback (ggml_backend_sched_eval_callback) that copies
 * named graph tensors (for example "l_out-8", the output of layer 8 = the input of layer 9) into
 * caller-owned float buffers while a batch is computed.
 *
 * Why C: the scheduler asks the callback about every graph node of every decode (about 700 nodes for
 * Gemma 3 270M); a Python ctypes callback costs about 2 us per call, a C one a few nanoseconds, so the
 * shim can stay installed on a context at no measurable cost and be switched on only while an EAGLE-3
 * drafter needs the features.
 *
 * The shim links against nothing: Python hands it the addresses of the three ggml functions it calls
 * (ggml_get_name, ggml_nbytes, ggml_backend_tensor_get) from the libggml-base that llama-cpp-python has
 * already loaded, and the tensor is only ever seen as an opaque pointer.
 *
 * Written for specviz (MIT); not derived from llama.cpp code.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SPECVIZ_MAX_TAPS 8
#define SPECVIZ_NAME_LEN 64

struct ggml_tensor;

typedef const char * (*specviz_get_name_fn)(const struct ggml_tensor *);
typedef size_t (*specviz_nbytes_fn)(const struct ggml_tensor *);
typedef void (*specviz_tensor_get_fn)(const struct ggml_tensor *, void *, size_t, size_t);

/* Mirrored field by field by the ctypes Structure in capture.py: keep both in step. */
struct specviz_capture {
    specviz_get_name_fn get_name;
    specviz_nbytes_fn nbytes;
    specviz_tensor_get_fn tensor_get;
    int32_t enabled;                         /* 0: answer "not needed" for every node */
    int32_t n_taps;
    int64_t row_bytes;                       /* bytes of one token row (n_embd floats) */
    int64_t capacity_rows;                   /* rows each destination buffer holds */
    char names[SPECVIZ_MAX_TAPS][SPECVIZ_NAME_LEN];
    void * dst[SPECVIZ_MAX_TAPS];
    int64_t rows[SPECVIZ_MAX_TAPS];          /* rows written since the caller last reset them */
    int64_t calls;                           /* observed tensors (for tests) */
    int32_t error;                           /* 1: a tensor overflowed its buffer, 2: odd tensor size */
};

static int specviz_find(const struct specviz_capture * c, const char * name) {
    for (int i = 0; i < c->n_taps; ++i) {
        if (strncmp(name, c->names[i], SPECVIZ_NAME_LEN) == 0) {
            return i;
        }
    }
    return -1;
}

bool specviz_capture_cb(struct ggml_tensor * t, bool ask, void * user_data) {
    struct specviz_capture * c = (struct specviz_capture *) user_data;
    if (c == NULL || !c->enabled) {
        /* ask == false only follows a "needed" answer; returning true there keeps the graph running */
        return !ask;
    }
    const char * name = c->get_name(t);
    const int i = name ? specviz_find(c, name) : -1;
    if (ask) {
        return i >= 0;
    }
    if (i < 0) {
        return true;
    }
    const size_t nb = c->nbytes(t);
    if (c->row_bytes <= 0 || nb % (size_t) c->row_bytes != 0) {
        c->error = 2;
        return true;
    }
    const int64_t n = (int64_t) (nb / (size_t) c->row_bytes);
    if (c->rows[i] + n > c->capacity_rows) {
        c->error = 1;
        return true;
    }
    c->tensor_get(t, (char *) c->dst[i] + c->rows[i] * c->row_bytes, 0, nb);
    c->rows[i] += n;
    c->calls += 1;
    return true;
}
