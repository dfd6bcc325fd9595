/* A host program in C11 that links only the shared library libllmcore. */
#include <stdio.h>
#include <string.h>

#include "llmcore/llmcore.h"

#define HOST_CHECK(cond)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "c_host:%d: %s failed (%s)\n", __LINE__, #cond, lc_last_error()); \
            return 1;                                                         \
        }                                                                     \
    } while (0)

/* The prefix-cache round trip a host performs: commit a full block, free the
 * sequence, find the block again by its tokens. */
static int exercise_block_pool(void) {
    lc_block_pool* pool = NULL;
    HOST_CHECK(lc_block_pool_create(8, 4, &pool) == LC_OK);

    int32_t ids[2] = {-1, -1};
    HOST_CHECK(lc_block_pool_allocate(pool, 2, ids) == LC_OK);
    HOST_CHECK(lc_block_pool_num_free(pool) == 6);

    const int32_t tokens[6] = {101, 102, 103, 104, 105, 106};
    uint64_t hash = 0;
    HOST_CHECK(lc_block_pool_commit(pool, ids[0], lc_block_hash_root(0), tokens, 4, &hash) ==
               LC_OK);
    HOST_CHECK(hash == lc_block_hash(lc_block_hash_root(0), tokens, 4));

    const int32_t tail_first[2] = {ids[1], ids[0]};
    HOST_CHECK(lc_block_pool_free(pool, tail_first, 2) == LC_OK);
    HOST_CHECK(lc_block_pool_num_free(pool) == 8);

    /* 6 tokens: one whole block can match, the rest is left to compute. */
    int32_t hit[1] = {-1};
    int32_t found = -1;
    HOST_CHECK(lc_block_pool_match_prefix(pool, 0, tokens, 6, hit, 1, &found) == LC_OK);
    HOST_CHECK(found == 1 && hit[0] == ids[0]);
    HOST_CHECK(lc_block_pool_ref_count(pool, ids[0]) == 1);

    lc_block_pool_stats st;
    HOST_CHECK(lc_block_pool_stats_get(pool, &st) == LC_OK);
    HOST_CHECK(st.num_used == 1 && st.num_cached == 1 && st.queries == 6 && st.hits == 4);
    HOST_CHECK(lc_block_pool_check(pool) == LC_OK);

    /* Errors come back as status codes with a message. */
    int32_t many[9];
    HOST_CHECK(lc_block_pool_allocate(pool, 9, many) == LC_ERR_OUT_OF_BLOCKS);
    HOST_CHECK(strlen(lc_last_error()) > 0);
    const int32_t bad[1] = {8};
    HOST_CHECK(lc_block_pool_free(pool, bad, 1) == LC_ERR_INVALID_ARGUMENT);
    HOST_CHECK(strstr(lc_last_error(), "out of range") != NULL);
    HOST_CHECK(lc_block_pool_ref_count(pool, -3) == LC_ERR_INVALID_ARGUMENT);

    HOST_CHECK(lc_block_pool_free(pool, hit, 1) == LC_OK);
    HOST_CHECK(lc_block_pool_num_free(pool) == 8);
    lc_block_pool_destroy(pool);
    return 0;
}

int main(void) {
    printf("llmcore %s (%s)\n", lc_version(), lc_build_features());
    if (lc_abi_version() != LC_ABI_VERSION) return 1;
    if (exercise_block_pool() != 0) return 1;
    return 0;
}
