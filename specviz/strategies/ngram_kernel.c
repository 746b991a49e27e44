/*
 * specviz n-gram search kernel: where an n-gram occurs in the token history, in one pass
 * (specviz/strategies/ngram_kernel.py loads it; specviz/strategies/history.py falls back to numpy).
 *
 * Why C: numpy finds an n-gram with a comparison over the history per pattern token, each a separate
 * call, and a drafter looks up right after a decode, when numpy's code and specviz's objects are out of
 * the caches (about a tenth of a millisecond a round for prompt-lookup and ngram-simple). Here a look-up
 * is one call that reads the history once. Plain C only (no hand-written vector builds).
 *
 * specviz_find_ngram(arr, len, pat, n, end, last): the start i of an occurrence arr[i .. i+n) == pat[0 .. n)
 * with 0 <= i < min(end, len - n + 1); the largest such i when last != 0, else the smallest; -1 when there
 * is none (or n <= 0, end <= 0). The same answer as history.find_ngram's numpy path.
 *
 * specviz_last_match(arr, len, pat, n, hi, lo): the largest j with lo < j <= hi (and j + n <= len) where
 * arr[j .. j+n) == pat; 0 when there is none (ngram-map's search of the not yet indexed positions).
 *
 * ngram-mod's pool (specviz/strategies/ngram_mod.py), with the polynomial hash
 * h = (...((t0*mult + t1)*mult + t2)...)*mult + t(n-1) mod 2^64 and the slot h mod pool_size. The pool is
 * read right after a decode too, and the hash in Python is a loop of n big-integer steps per n-gram:
 *
 * specviz_poly_hash(w, n, mult): the hash of w[0 .. n).
 *
 * specviz_poly_last_slot(arr, start, stop, n, mult, pool_size, slot): the largest p with start <= p < stop
 * whose n-gram arr[p .. p+n) lands in `slot`; -1 when none does. The hash is rolled from one position to
 * the next (out with the oldest token's weight mult^(n-1), in with the next token), so a long range costs a
 * few operations a position: a peek's n-grams not yet added to the pool.
 *
 * specviz_poly_chain(pool, pool_size, empty, w, n, mult, n_max, out): from the n-gram w[0 .. n), read the
 * pool's token for its slot, append it, slide the n-gram by one, up to n_max tokens or the first slot that
 * holds `empty`; writes the tokens to out and returns how many. ngram-mod's draft.
 *
 * Tokens enter the hash as their 64-bit two's complement (NumPy's astype(uint64), Python's `& (2^64-1)`).
 *
 * Written for specviz (MIT).
 */
#include <stdint.h>

static int specviz_matches(const int32_t * a, const int32_t * pat, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        if (a[j] != pat[j]) {
            return 0;
        }
    }
    return 1;
}

int64_t specviz_find_ngram(const int32_t * arr, int64_t len, const int32_t * pat, int64_t n, int64_t end,
                           int32_t last) {
    if (n <= 0 || end <= 0) {
        return -1;
    }
    int64_t limit = len - n + 1;
    if (end < limit) {
        limit = end;
    }
    if (last) {
        for (int64_t i = limit - 1; i >= 0; --i) {
            if (arr[i] == pat[0] && specviz_matches(arr + i, pat, n)) {
                return i;
            }
        }
    } else {
        for (int64_t i = 0; i < limit; ++i) {
            if (arr[i] == pat[0] && specviz_matches(arr + i, pat, n)) {
                return i;
            }
        }
    }
    return -1;
}

int64_t specviz_last_match(const int32_t * arr, int64_t len, const int32_t * pat, int64_t n, int64_t hi,
                           int64_t lo) {
    if (n <= 0) {
        return 0;
    }
    if (hi > len - n) {
        hi = len - n;
    }
    for (int64_t j = hi; j > lo; --j) {
        if (arr[j] == pat[0] && specviz_matches(arr + j, pat, n)) {
            return j;
        }
    }
    return 0;
}

uint64_t specviz_poly_hash(const int32_t * w, int64_t n, uint64_t mult) {
    uint64_t h = 0;
    for (int64_t j = 0; j < n; ++j) {
        h = h * mult + (uint64_t) (int64_t) w[j];
    }
    return h;
}

int64_t specviz_poly_last_slot(const int32_t * arr, int64_t start, int64_t stop, int64_t n, uint64_t mult,
                               uint64_t pool_size, uint64_t slot) {
    if (n <= 0 || stop <= start || pool_size == 0) {
        return -1;
    }
    uint64_t top = 1;  // the oldest token's weight, mult^(n-1)
    for (int64_t j = 1; j < n; ++j) {
        top *= mult;
    }
    int64_t found = -1;
    uint64_t h = specviz_poly_hash(arr + start, n, mult);
    for (int64_t p = start;; ++p) {
        if (h % pool_size == slot) {
            found = p;
        }
        if (p + 1 >= stop) {
            break;
        }
        h = (h - (uint64_t) (int64_t) arr[p] * top) * mult + (uint64_t) (int64_t) arr[p + n];
    }
    return found;
}

int64_t specviz_poly_chain(const int32_t * pool, uint64_t pool_size, int32_t empty, const int32_t * w, int64_t n,
                           uint64_t mult, int64_t n_max, int32_t * out) {
    if (n <= 0 || pool_size == 0) {
        return 0;
    }
    uint64_t top = 1;
    for (int64_t j = 1; j < n; ++j) {
        top *= mult;
    }
    uint64_t h = specviz_poly_hash(w, n, mult);
    int64_t k = 0;
    for (; k < n_max; ++k) {
        int32_t tok = pool[h % pool_size];
        if (tok == empty) {
            break;
        }
        out[k] = tok;
        // the n-gram slides by one: its oldest token is w[k] while k < n, else a token drafted n steps ago
        int32_t old = k < n ? w[k] : out[k - n];
        h = (h - (uint64_t) (int64_t) old * top) * mult + (uint64_t) (int64_t) tok;
    }
    return k;
}
