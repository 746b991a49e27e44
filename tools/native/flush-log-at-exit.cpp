// Linked into specviz's build of llama-speculative-simple (tools/native/CMakeLists.txt): empty llama.cpp's
// log queue before the process ends.
//
// Why: the tool prints everything — the generated text on stdout, its counters (n_predict, n_drafted,
// n_accept) and its decode time on stderr — through common_log, whose background thread writes the
// queue out. llama.cpp leaks that logger on purpose and never stops it (common_log_main(), llama.cpp
// issue 22142), so whatever the thread has not written when main() returns is lost. On a tiny model the
// whole run takes a few milliseconds, and the thread often loses the race: measured here, 26 of 40 runs
// lost their counters on two cores and 40 of 40 on one. specviz reads those counters
// (specviz/analysis/native.py), so its build of the tool stops the logger at exit, which writes every
// queued line first (common_log_pause joins the thread after it has flushed the queue).
//
// Departure from upstream: none in the tool's own source; this file only adds an exit handler.

#include "log.h"

#include <cstdlib>

namespace {

void flush_common_log() {
    common_log_pause(common_log_main());
}

// registered before main() runs; exit() calls it before stdio is flushed and closed
[[maybe_unused]] const int registered = std::atexit(flush_common_log);

}  // namespace
