/*
 * specviz n-gram search kernel: where an n-gram occurs in the token history, in one pass
 * (specviz/strategies/ngram_kernel.py loads it; specviz/strategies/history.py falls back to numpy).
 *
 * Why C: numpy finds an n-gram with a comparison over the history per pattern token, each a separate
 * call, and a drafter's look-up ran right after a decode, when numpy's code and specviz's objects are
 * out of the caches: prompt-lookup and ngram-simple spent a tenth of a millisecond a round on it. Here a
 * look-up is one call that reads the history once.
 *
 * specviz_find_ngram(arr, len, pat, n, end, last): the start i of an occurrence arr[i .. i+n) == pat[0 .. n)
 * with 0 <= i < min(end, len - n + 1); the largest such i when last != 0, else the smallest; -1 when there
 * is none (or n <= 0, end <= 0). The same answer as history.find_ngram's numpy path.
 *
 * specviz_last_match(arr, len, pat, n, hi, lo): the largest j with lo < j <= hi (and j + n <= len) where
 * arr[j .. j+n) == pat; 0 when there is none (ngram-map's search of the not yet indexed positions).
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
