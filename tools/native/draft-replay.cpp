// specviz-draft-replay: drive llama.cpp's own draftless speculative implementations (common_speculative_*)
// with a scripted token history, and print every draft they propose.
//
// specviz's differential tests use it to compare its drafters with llama.cpp's draft for draft, on any
// history, without a model. It calls the same functions, in the same order, as
// examples/speculative-simple does: begin once with the prompt (without its last token), then per round
// draft (with the history and the pending last token, capped by n_max as the tool caps it) and accept.
//
// Commands, one per line on stdin:
//   init TYPE [KEY=VALUE ...]   TYPE: ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache;
//                               KEY: size_n, size_m, min_hits (ngram-simple, ngram-map-*),
//                                    n_match, n_min, n_max (ngram-mod)
//   push T ...                  append tokens to the history the target holds (the tool's prompt_tgt)
//   last T                      set the pending last token (the tool's id_last)
//   begin                       common_speculative_begin with the history
//   draft N                     a draft with n_max = N; prints "draft K T1 ... TK"
//   accept N                    common_speculative_accept with N accepted tokens
// Any error prints "error ..." and exits with status 1.

#include "common.h"
#include "log.h"
#include "speculative.h"

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

static int fail(const std::string & msg) {
    std::printf("error %s\n", msg.c_str());
    std::fflush(stdout);
    return 1;
}

static bool set_param(common_params_speculative & p, common_speculative_type type, const std::string & key, int value) {
    common_params_speculative_ngram_map * map = nullptr;
    if (type == COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE) {
        map = &p.ngram_simple;
    } else if (type == COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K) {
        map = &p.ngram_map_k;
    } else if (type == COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K4V) {
        map = &p.ngram_map_k4v;
    }
    if (map != nullptr) {
        if (key == "size_n")   { map->size_n   = (uint16_t) value; return true; }
        if (key == "size_m")   { map->size_m   = (uint16_t) value; return true; }
        if (key == "min_hits") { map->min_hits = (uint16_t) value; return true; }
        return false;
    }
    if (type == COMMON_SPECULATIVE_TYPE_NGRAM_MOD) {
        if (key == "n_match") { p.ngram_mod.n_match = value; return true; }
        if (key == "n_min")   { p.ngram_mod.n_min   = value; return true; }
        if (key == "n_max")   { p.ngram_mod.n_max   = value; return true; }
    }
    return false;
}

int main() {
    common_log_set_verbosity_thold(-1);  // quiet: the output is the protocol only

    common_params_speculative params;
    common_speculative * spec = nullptr;
    llama_tokens prompt;
    llama_token id_last = 0;
    llama_tokens draft;

    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd;
        if (!(in >> cmd)) {
            continue;
        }
        if (cmd == "init") {
            std::string name;
            in >> name;
            const auto type = common_speculative_type_from_name(name);
            if (type == COMMON_SPECULATIVE_TYPE_COUNT || type == COMMON_SPECULATIVE_TYPE_NONE) {
                return fail("unknown type " + name);
            }
            params = common_params_speculative{};
            params.types = {type};
            std::string kv;
            while (in >> kv) {
                const auto eq = kv.find('=');
                if (eq == std::string::npos || !set_param(params, type, kv.substr(0, eq), std::stoi(kv.substr(eq + 1)))) {
                    return fail("bad parameter " + kv + " for " + name);
                }
            }
            if (spec != nullptr) {
                common_speculative_free(spec);
            }
            spec = common_speculative_init(params, 1);
            if (spec == nullptr) {
                return fail("common_speculative_init failed");
            }
            prompt.clear();
        } else if (spec == nullptr) {
            return fail("init first");
        } else if (cmd == "push") {
            llama_token t;
            while (in >> t) {
                prompt.push_back(t);
            }
        } else if (cmd == "last") {
            in >> id_last;
        } else if (cmd == "begin") {
            common_speculative_begin(spec, 0, prompt);
        } else if (cmd == "draft") {
            int n_max = 0;
            in >> n_max;
            draft.clear();
            common_speculative_get_draft_params(spec, 0) = {
                /* .drafting = */ true,
                /* .n_max    = */ n_max,
                /* .pos0     = */ (llama_pos) prompt.size(),
                /* .id_last  = */ id_last,
                /* .prompt   = */ &prompt,
                /* .result   = */ &draft,
            };
            common_speculative_draft(spec);
            std::printf("draft %zu", draft.size());
            for (const auto t : draft) {
                std::printf(" %d", t);
            }
            std::printf("\n");
            std::fflush(stdout);
        } else if (cmd == "accept") {
            int n = 0;
            in >> n;
            common_speculative_accept(spec, 0, (uint16_t) n);
        } else {
            return fail("unknown command " + cmd);
        }
    }
    common_speculative_free(spec);
    return 0;
}
