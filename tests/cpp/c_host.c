/* A host program in C11 that links only the shared library libllmcore. */
#include <math.h>
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

static lc_tensor make_tensor(void* data, int32_t ndim, const int64_t* shape) {
    lc_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = LC_DTYPE_F32;
    t.device = LC_DEVICE_CPU;
    t.ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; --i) {
        t.shape[i] = shape[i];
        t.strides[i] = stride;
        stride *= shape[i];
    }
    return t;
}

/* One decode step of one sequence: 3 cached tokens + 1 new, 2 query heads on 1 KV head,
 * head size 64, block size 4. The new token's key equals the query direction, so the
 * output must lean towards its value; checked against a naive softmax here. */
enum { HS = 64, BS = 4, NB = 2, CTX = 4 };
static float k_cache[NB * 1 * BS * HS], v_cache[NB * 1 * BS * HS];

static int exercise_attention(void) {
    float q[2 * HS], out[2 * HS];
    int32_t query_start[2] = {0, 1}, seq_lens[1] = {CTX}, table[1] = {1};
    int64_t slot_prev[3] = {1 * BS + 0, 1 * BS + 1, 1 * BS + 2};
    int64_t slot_new[1] = {1 * BS + 3};
    float keys[CTX][HS], vals[CTX][HS];
    for (int t = 0; t < CTX; ++t)
        for (int d = 0; d < HS; ++d) {
            keys[t][d] = (float)sin(0.1 * (t + 1) * (d + 1));
            vals[t][d] = (float)(t * 10 + d % 7);
        }
    /* Store the 3 earlier tokens with a 3-token plan, then the step's own token. */
    for (int t = 0; t < CTX; ++t) {
        int32_t qs[2] = {0, 1}, sl[1] = {t + 1};
        lc_attn_metadata md = {1, 1, qs, sl, table, 1, t < 3 ? &slot_prev[t] : slot_new};
        lc_attn_plan* plan = NULL;
        HOST_CHECK(lc_attn_plan_create(&md, LC_DEVICE_CPU, NB, NULL, &plan) == LC_OK);
        int64_t kv_shape[3] = {1, 1, HS};
        lc_tensor kt = make_tensor(keys[t], 3, kv_shape), vt = make_tensor(vals[t], 3, kv_shape);
        int64_t cache_shape[4] = {NB, 1, BS, HS};
        lc_tensor kc = make_tensor(k_cache, 4, cache_shape), vc = make_tensor(v_cache, 4, cache_shape);
        HOST_CHECK(lc_kv_store(plan, &kt, &vt, &kc, &vc, NULL) == LC_OK);
        lc_attn_plan_destroy(plan);
    }
    for (int h = 0; h < 2; ++h)
        for (int d = 0; d < HS; ++d) q[h * HS + d] = (h + 1) * keys[CTX - 1][d];

    lc_attn_metadata md = {1, 1, query_start, seq_lens, table, 1, slot_new};
    lc_attn_plan* plan = NULL;
    HOST_CHECK(lc_attn_plan_create(&md, LC_DEVICE_CPU, NB, NULL, &plan) == LC_OK);
    int64_t q_shape[3] = {1, 2, HS}, cache_shape[4] = {NB, 1, BS, HS};
    lc_tensor qt = make_tensor(q, 3, q_shape), ot = make_tensor(out, 3, q_shape);
    lc_tensor kc = make_tensor(k_cache, 4, cache_shape), vc = make_tensor(v_cache, 4, cache_shape);
    lc_attn_params p = {0.125f, 0, 0.0f};
    HOST_CHECK(lc_paged_attention(plan, &qt, &kc, &vc, &ot, &p, NULL) == LC_OK);
    lc_attn_plan_destroy(plan);

    for (int h = 0; h < 2; ++h) {
        double s[CTX], m = -1e30, z = 0;
        for (int t = 0; t < CTX; ++t) {
            s[t] = 0;
            for (int d = 0; d < HS; ++d) s[t] += q[h * HS + d] * keys[t][d];
            s[t] *= 0.125;
            if (s[t] > m) m = s[t];
        }
        for (int t = 0; t < CTX; ++t) z += exp(s[t] - m);
        for (int d = 0; d < HS; ++d) {
            double want = 0;
            for (int t = 0; t < CTX; ++t) want += exp(s[t] - m) / z * vals[t][d];
            HOST_CHECK(fabs(want - out[h * HS + d]) < 1e-3);
        }
    }
    /* A bad head size is refused with a status and a message, not a crash. */
    int64_t bad_shape[3] = {1, 2, 63};
    lc_tensor bad = make_tensor(q, 3, bad_shape);
    HOST_CHECK(lc_attn_plan_create(&md, LC_DEVICE_CPU, NB, NULL, &plan) == LC_OK);
    HOST_CHECK(lc_paged_attention(plan, &bad, &kc, &vc, &ot, &p, NULL) == LC_ERR_INVALID_ARGUMENT);
    HOST_CHECK(strlen(lc_last_error()) > 0);
    lc_attn_plan_destroy(plan);
    return 0;
}

/* Two rows over a 100-token vocabulary: greedy, and a seeded top-k draw that must be
 * reproducible and inside the top-k set; the greedy row also reports top-3 logprobs. */
static int exercise_sampling(void) {
    enum { V = 100 };
    float logits[2 * V];
    for (int i = 0; i < 2 * V; ++i) logits[i] = (float)((i * 37) % V) / 10.0f;
    int64_t shape[2] = {2, V};
    lc_tensor lt = make_tensor(logits, 2, shape);
    lc_sampling_row rows[2];
    memset(rows, 0, sizeof rows);
    for (int r = 0; r < 2; ++r) {
        rows[r].top_p = 1.0f;
        rows[r].repetition_penalty = 1.0f;
    }
    rows[1].temperature = 1.0f;
    rows[1].top_k = 5;
    rows[1].seed = 42;
    rows[1].position = 3;
    lc_sampling_batch batch;
    memset(&batch, 0, sizeof batch);
    batch.num_rows = 2;
    batch.rows = rows;
    batch.num_top_logprobs = 3;
    /* Listed logprobs: row 0 lists none, row 1 its top token's id (found below) twice. */
    int32_t listed_offsets[3] = {0, 0, 2}, listed_ids[2] = {0, 0};
    batch.logprob_offsets = listed_offsets;
    batch.logprob_ids = listed_ids;
    int32_t tokens[2], top_tokens[6];
    float logprobs[2], top_logprobs[6], listed[2];
    lc_sample_output so = {tokens, logprobs, NULL, top_tokens, top_logprobs, listed};
    HOST_CHECK(lc_sample(&lt, &batch, NULL, &so) == LC_OK);
    listed_ids[0] = listed_ids[1] = top_tokens[3];
    HOST_CHECK(lc_sample(&lt, &batch, NULL, &so) == LC_OK);
    HOST_CHECK(listed[0] == top_logprobs[3] && listed[1] == top_logprobs[3]);
    lc_sample_output no_listed = {tokens, logprobs, NULL, top_tokens, top_logprobs, NULL};
    HOST_CHECK(lc_sample(&lt, &batch, NULL, &no_listed) == LC_ERR_INVALID_ARGUMENT);
    int best = 0;
    for (int i = 1; i < V; ++i)
        if (logits[i] > logits[best]) best = i;
    HOST_CHECK(tokens[0] == best && top_tokens[0] == best);
    HOST_CHECK(logprobs[0] <= 0.0f && top_logprobs[0] >= top_logprobs[1]);
    /* The draw is in the top 5 of row 1 and the same when repeated. */
    int above = 0;
    for (int i = 0; i < V; ++i) above += logits[V + i] > logits[V + tokens[1]];
    HOST_CHECK(above < 5);
    int32_t first = tokens[1];
    HOST_CHECK(lc_sample(&lt, &batch, NULL, &so) == LC_OK);
    HOST_CHECK(tokens[1] == first);
    /* Bad parameters: a status, never a crash. */
    rows[1].top_p = 2.0f;
    HOST_CHECK(lc_sample(&lt, &batch, NULL, &so) == LC_ERR_INVALID_ARGUMENT);
    return 0;
}

/* The pieces of one decoder layer a host would chain: pack a projection once,
 * multiply, add the residual and normalise, gate the MLP, rotate. Checked against
 * plain loops. */
#define LN 20 /* output columns: one full panel of 16 and a ragged one */
#define LK 24
static float lw[LN * LK], lx[2 * LK], ly[2 * LN], lbias[LN];
static int exercise_layer_ops(void) {
    for (int i = 0; i < LN * LK; ++i) lw[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    for (int i = 0; i < 2 * LK; ++i) lx[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < LN; ++i) lbias[i] = 0.01f * (float)i;
    const int64_t wshape[2] = {LN, LK}, xshape[2] = {2, LK}, yshape[2] = {2, LN}, bshape[1] = {LN};
    lc_tensor wt = make_tensor(lw, 2, wshape), xt = make_tensor(lx, 2, xshape);
    lc_tensor yt = make_tensor(ly, 2, yshape), bt = make_tensor(lbias, 1, bshape);
    lc_weight* w = NULL;
    HOST_CHECK(lc_weight_pack(&wt, &w) == LC_OK);
    int64_t n = 0, k = 0, nbytes = 0;
    int32_t dtype = -1;
    HOST_CHECK(lc_weight_info(w, &n, &k, &dtype, &nbytes) == LC_OK);
    HOST_CHECK(n == LN && k == LK && dtype == LC_DTYPE_F32 && nbytes >= LN * LK * 4);
    HOST_CHECK(lc_linear_packed(&xt, w, &bt, &yt, NULL) == LC_OK);
    for (int m = 0; m < 2; ++m)
        for (int c = 0; c < LN; ++c) {
            float want = lbias[c];
            for (int i = 0; i < LK; ++i) want += lx[m * LK + i] * lw[c * LK + i];
            HOST_CHECK(fabsf(ly[m * LN + c] - want) < 1e-4f);
        }
    /* A row lookup (a tied embedding) returns the source row. */
    const int64_t ids[1] = {LN - 1};
    float row[LK];
    const int64_t rshape[2] = {1, LK};
    lc_tensor rt = make_tensor(row, 2, rshape);
    HOST_CHECK(lc_weight_rows(w, ids, 1, &rt) == LC_OK);
    HOST_CHECK(memcmp(row, lw + (LN - 1) * LK, sizeof row) == 0);
    lc_weight_destroy(w);

    /* residual += y; y = rms_norm(residual) * 1: every row has mean square 1. */
    float res[2 * LN] = {0}, ones[LN];
    for (int i = 0; i < LN; ++i) ones[i] = 1.0f;
    const int64_t oshape[1] = {LN};
    lc_tensor rest = make_tensor(res, 2, yshape), onest = make_tensor(ones, 1, oshape);
    HOST_CHECK(lc_rms_norm(&yt, &rest, &onest, 0.0f, &yt) == LC_OK);
    for (int m = 0; m < 2; ++m) {
        float ss = 0.0f;
        for (int c = 0; c < LN; ++c) ss += ly[m * LN + c] * ly[m * LN + c];
        HOST_CHECK(fabsf(ss / LN - 1.0f) < 1e-4f);
    }
    HOST_CHECK(lc_rms_norm(&yt, &yt, &onest, 0.0f, &yt) == LC_ERR_INVALID_ARGUMENT);

    /* silu(g) * u on [1, 2 x 2]: silu(0) = 0, silu(big) = big. */
    float gu[4] = {0.0f, 30.0f, 5.0f, 2.0f}, act[2];
    const int64_t gshape[2] = {1, 4}, ashape[2] = {1, 2};
    lc_tensor gt = make_tensor(gu, 2, gshape), at = make_tensor(act, 2, ashape);
    HOST_CHECK(lc_silu_mul(&gt, &at) == LC_OK);
    HOST_CHECK(act[0] == 0.0f && fabsf(act[1] - 60.0f) < 1e-4f);

    /* Rotating by 90 degrees maps (a, b) to (-b, a). */
    float q[4] = {1.0f, 2.0f, 3.0f, 4.0f}, cs[2] = {0.0f, 0.0f}, sn[2] = {1.0f, 1.0f};
    const int64_t qshape[3] = {1, 1, 4}, tshape[2] = {1, 2};
    lc_tensor qt = make_tensor(q, 3, qshape), ct = make_tensor(cs, 2, tshape),
              st = make_tensor(sn, 2, tshape);
    HOST_CHECK(lc_rope(&qt, NULL, &ct, &st) == LC_OK);
    HOST_CHECK(q[0] == -3.0f && q[1] == -4.0f && q[2] == 1.0f && q[3] == 2.0f);
    return 0;
}

/* An MoE layer of 3 experts, 2 tokens routed to 2 each: one grouped call against
 * plain loops, then an id out of range refused. */
#define MH 8
#define MI 4
#define ME 3
static float mgu[ME][2 * MI * MH], mdn[ME][MH * MI], mx[2 * MH], mout[2 * MH];
static int exercise_moe(void) {
    const lc_weight* gate_up[ME];
    const lc_weight* down[ME];
    lc_weight* owned[2 * ME];
    const int64_t gushape[2] = {2 * MI, MH}, dnshape[2] = {MH, MI};
    for (int e = 0; e < ME; ++e) {
        for (int i = 0; i < 2 * MI * MH; ++i) mgu[e][i] = (float)((i * 3 + e) % 7) / 7.0f - 0.4f;
        for (int i = 0; i < MH * MI; ++i) mdn[e][i] = (float)((i * 5 + e) % 9) / 9.0f - 0.5f;
        lc_tensor g = make_tensor(mgu[e], 2, gushape), d = make_tensor(mdn[e], 2, dnshape);
        HOST_CHECK(lc_weight_pack(&g, &owned[2 * e]) == LC_OK);
        HOST_CHECK(lc_weight_pack(&d, &owned[2 * e + 1]) == LC_OK);
        gate_up[e] = owned[2 * e];
        down[e] = owned[2 * e + 1];
    }
    for (int i = 0; i < 2 * MH; ++i) mx[i] = (float)((i * 7) % 5) / 5.0f - 0.3f;
    int32_t ids[4] = {2, 0, 1, 2};
    float w[4] = {0.7f, 0.3f, 0.6f, 0.4f};
    const int64_t xshape[2] = {2, MH}, wshape[2] = {2, 2};
    lc_tensor xt = make_tensor(mx, 2, xshape), wt = make_tensor(w, 2, wshape),
              ot = make_tensor(mout, 2, xshape);
    HOST_CHECK(lc_moe_experts(&xt, ids, 4, &wt, gate_up, down, ME, &ot) == LC_OK);
    for (int t = 0; t < 2; ++t)
        for (int h = 0; h < MH; ++h) {
            float want = 0.0f;
            for (int j = 0; j < 2; ++j) {
                const int e = ids[t * 2 + j];
                float y = 0.0f;
                for (int i = 0; i < MI; ++i) {
                    float g = 0.0f, u = 0.0f;
                    for (int c = 0; c < MH; ++c) {
                        g += mx[t * MH + c] * mgu[e][i * MH + c];
                        u += mx[t * MH + c] * mgu[e][(MI + i) * MH + c];
                    }
                    y += g / (1.0f + expf(-g)) * u * mdn[e][h * MI + i];
                }
                want += w[t * 2 + j] * y;
            }
            HOST_CHECK(fabsf(mout[t * MH + h] - want) < 1e-4f);
        }
    ids[1] = ME;
    HOST_CHECK(lc_moe_experts(&xt, ids, 4, &wt, gate_up, down, ME, &ot) == LC_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 2 * ME; ++i) lc_weight_destroy(owned[i]);
    return 0;
}

int main(void) {
    printf("llmcore %s (%s)\n", lc_version(), lc_build_features());
    if (lc_abi_version() != LC_ABI_VERSION) return 1;
    if (exercise_block_pool() != 0) return 1;
    if (exercise_attention() != 0) return 1;
    if (exercise_sampling() != 0) return 1;
    if (exercise_layer_ops() != 0) return 1;
    if (exercise_moe() != 0) return 1;
    return 0;
}
